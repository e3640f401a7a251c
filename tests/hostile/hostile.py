"""Shared harness of the hostile-input suite (ctest -L hostile).

Each test_<area>.py in this folder defines functions named `case_<what>(h)`; `main()` runs them
(all, or the ones named with --case) and prints `N passed, N failed`. Every case runs kiln as a
user would and asserts the four promises of the hardening issue:
  - a clean catalog error (a `KILN-Ennnn` on stderr, the expected one when a case names it),
  - an exit code in 1..127 (no signal, no crash),
  - a bound on time (the run is killed and the case fails past its bound),
  - every pre-existing file in the case's folder byte-for-byte intact, no temporary left over.
"""
import argparse
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback

CODE_RE = re.compile(r"KILN-E(\d{4})")


class CaseFailure(AssertionError):
    pass


class Result:
    def __init__(self, args, rc, out, err, seconds):
        self.args, self.rc, self.out, self.err, self.seconds = args, rc, out, err, seconds

    def codes(self):
        return ["KILN-E" + c for c in CODE_RE.findall(self.err + self.out)]

    def __repr__(self):
        return "rc=%s after %.1fs\n--- stdout\n%s\n--- stderr\n%s" % (
            self.rc, self.seconds, self.out[-2000:], self.err[-2000:])


def _snapshot(folder):
    """Bytes (or, for special files, type and inode) of everything under folder."""
    snap = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    snap[path] = ("file", f.read())
            elif stat.S_ISLNK(st.st_mode):
                snap[path] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                snap[path] = ("dir", None)
            else:
                snap[path] = ("special", (stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev))
    return snap


class Harness:
    """What a case gets: a private folder, the kiln binary, the repository, helpers to run."""

    def __init__(self, kiln, source_dir, work):
        self.kiln = kiln
        self.src = source_dir
        self.work = work
        self._before = None

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def copy(self, rel_src, name=None):
        """Copies a file of the repository (e.g. zoo/resnet_tiny/model.onnx) into the case folder."""
        dst = self.path(name or os.path.basename(rel_src))
        shutil.copyfile(os.path.join(self.src, rel_src), dst)
        return dst

    def write(self, name, data):
        p = self.path(name)
        with open(p, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        return p

    def freeze(self):
        """Takes the snapshot that check_intact compares against (call after setting up files)."""
        self._before = _snapshot(self.work)

    def run(self, args, timeout=60, stdin=None, env=None, signal_after=None, sig=signal.SIGTERM):
        """Runs kiln ARGS with a bound; signal_after=(seconds) sends sig to it first."""
        full = [self.kiln] + list(args)
        e = dict(os.environ)
        e.update(env or {})
        start = time.monotonic()
        p = subprocess.Popen(full, cwd=self.work, stdin=subprocess.PIPE if stdin is not None else
                             subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=e, start_new_session=True)
        try:
            if signal_after is not None:
                try:
                    p.wait(timeout=signal_after)
                except subprocess.TimeoutExpired:
                    p.send_signal(sig)
            out, err = p.communicate(input=stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise CaseFailure("no answer within %ss (hung): %s\n%s" % (
                timeout, " ".join(full), err.decode(errors="replace")[-2000:]))
        return Result(full, p.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                      time.monotonic() - start)

    def refused(self, args, code=None, timeout=60, **kw):
        """Runs kiln and asserts a clean refusal: exit 1..127, a catalog code (this one if given),
        within the bound, and every file that was there before intact."""
        if self._before is None:
            self.freeze()
        r = self.run(args, timeout=timeout, **kw)
        if r.rc < 0 or r.rc >= 128:
            raise CaseFailure("crashed or killed (rc %s): %s\n%r" % (r.rc, " ".join(r.args), r))
        if r.rc == 0:
            raise CaseFailure("accepted what should be refused: %s\n%r" % (" ".join(r.args), r))
        codes = r.codes()
        if not codes:
            raise CaseFailure("refused without a catalog code: %s\n%r" % (" ".join(r.args), r))
        if code and code not in codes:
            raise CaseFailure("expected %s, got %s: %s\n%r" % (code, codes, " ".join(r.args), r))
        self.check_intact()
        return r

    def check_intact(self, allow_new=()):
        """Every file present at freeze() is unchanged; nothing new but the names in allow_new,
        and never a temporary (*.tmp*)."""
        after = _snapshot(self.work)
        for path, what in self._before.items():
            if path not in after:
                raise CaseFailure("%s was removed" % path)
            if after[path] != what:
                raise CaseFailure("%s was changed (%s -> %s)" % (path, what[0], after[path][0]))
        for path in after:
            if path in self._before:
                continue
            base = os.path.basename(path)
            if ".tmp" in base:
                raise CaseFailure("temporary file left behind: %s" % path)
            if base not in allow_new:
                raise CaseFailure("unexpected new file: %s" % path)


def main(module_globals):
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--case", action="append", help="run only these cases (without case_)")
    a = ap.parse_args()
    cases = sorted((n[5:], f) for n, f in module_globals.items()
                   if n.startswith("case_") and callable(f))
    if a.case:
        cases = [c for c in cases if c[0] in a.case]
    passed = failed = 0
    for name, fn in cases:
        work = tempfile.mkdtemp(prefix="kiln-hostile-%s-" % name)
        h = Harness(os.path.abspath(a.kiln), os.path.abspath(a.source_dir), work)
        start = time.monotonic()
        try:
            fn(h)
            passed += 1
            print("[ OK ] %s (%.1fs)" % (name, time.monotonic() - start), flush=True)
        except Exception:  # a case's failure is reported and the suite goes on
            failed += 1
            print("[FAIL] %s\n%s" % (name, traceback.format_exc()), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed or not cases else 0)
