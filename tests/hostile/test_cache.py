"""Hostile cases for the engine cache's own files (issue 17, trust and files): lock, heartbeat and
takeover files that are links, special files or other users' are neither followed nor trusted nor
waited on; the cache never replaces nor removes a file of the command (the model kept in the cache
directory under an entry's name); its temporaries leave with the process on SIGTERM/SIGINT.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
from hostile import CaseFailure  # noqa: E402

MODEL = "zoo/bert_tiny/model.onnx"
PROFILE = ["--profile", "input_ids:1x8,1x8,1x8", "--profile", "attention_mask:1x8,1x8,1x8",
           "--profile", "token_type_ids:1x8,1x8,1x8"]
DIST = ["--distributed", "--transport", "cache", "--rank", "0", "--world-size", "1"]


def _dist_build(h, model, cache, out="dist.kiln", extra=()):
    return ["build", model, "-o", h.path(out), "--cache-dir", cache] + DIST + PROFILE + list(extra)


def _key(h):
    """Builds once into a private cache; returns (model, cache dir, key), the entry removed."""
    model = h.copy(MODEL, "model.onnx")
    cache = h.path("cache")
    os.mkdir(cache, 0o700)
    r = h.run(_dist_build(h, model, cache), timeout=120)
    if r.rc != 0:
        raise CaseFailure("distributed build into the cache failed: %r" % r)
    entries = [n for n in os.listdir(cache) if n.endswith(".engine")]
    if len(entries) != 1:
        raise CaseFailure("expected one cache entry, found %s" % os.listdir(cache))
    os.remove(h.path("dist.kiln"))
    key = entries[0][:-len(".engine")]
    # The lock file stays after a build (by design); the cases plant their own.
    for suffix in (".lock", ".hb"):
        if os.path.lexists(os.path.join(cache, key + suffix)):
            os.remove(os.path.join(cache, key + suffix))
    return model, cache, key


def _refused_fast(h, args, code="KILN-E7017", bound=20):
    r = h.refused(args, code=code, timeout=bound + 10)
    if r.seconds > bound:
        raise CaseFailure("refused only after %.1f s: %r" % (r.seconds, r))
    return r


def case_lock_file_links_are_not_followed(h):
    model, cache, key = _key(h)
    os.remove(os.path.join(cache, key + ".engine"))
    h.write("victim.txt", b"the user's file")
    lock = os.path.join(cache, key + ".lock")
    os.symlink(h.path("victim.txt"), lock)
    h.freeze()
    r = _refused_fast(h, _dist_build(h, model, cache))
    if "symbolic link" not in r.err:
        raise CaseFailure("the refusal does not say it is a link: %r" % r)
    # A dangling link: opening it to create the lock would create its target.
    os.remove(lock)
    os.symlink(h.path("created-through-link"), lock)
    h._before = None
    _refused_fast(h, _dist_build(h, model, cache))
    if os.path.exists(h.path("created-through-link")):
        raise CaseFailure("the lock link's target was created")


def case_lock_and_heartbeat_special_files(h):
    model, cache, key = _key(h)
    os.remove(os.path.join(cache, key + ".engine"))
    for name, make in ((key + ".lock", lambda p: os.mkfifo(p)),
                       (key + ".hb", lambda p: os.mkfifo(p)),
                       (key + ".hb", lambda p: os.symlink("/dev/zero", p))):
        path = os.path.join(cache, name)
        make(path)
        lock = os.path.join(cache, key + ".lock")
        if not os.path.lexists(lock):  # an ordinary lock file, as a previous build leaves it
            with open(lock, "w"):
                pass
            os.chmod(lock, 0o644)
        h._before = None
        h.freeze()
        # Trusting the shared cache does not make a FIFO or a link acceptable.
        _refused_fast(h, _dist_build(h, model, cache))
        _refused_fast(h, _dist_build(h, model, cache, extra=["--trust-shared-cache"]))
        os.remove(path)
        if os.path.lexists(lock) and name != key + ".lock":
            os.remove(lock)


def case_control_files_writable_by_others(h):
    model, cache, key = _key(h)
    os.remove(os.path.join(cache, key + ".engine"))
    lock = os.path.join(cache, key + ".lock")
    with open(lock, "w"):
        pass
    os.chmod(lock, 0o666)
    h.freeze()
    r = _refused_fast(h, _dist_build(h, model, cache))
    if "--trust-shared-cache" not in r.err:
        raise CaseFailure("the refusal does not name the option: %r" % r)
    if os.geteuid() == 0:  # another user's lock file
        os.chmod(lock, 0o644)
        os.chown(lock, 65534, 65534)
        h._before = None
        r = _refused_fast(h, _dist_build(h, model, cache))
        if "another user" not in r.err:
            raise CaseFailure("the refusal does not name the owner: %r" % r)
    # Accepted when the risk is accepted.
    r = h.run(_dist_build(h, model, cache, extra=["--trust-shared-cache"]), timeout=120)
    if r.rc != 0:
        raise CaseFailure("--trust-shared-cache should accept it: %r" % r)


def case_entry_link_is_not_followed(h):
    model, cache, key = _key(h)
    entry = os.path.join(cache, key + ".engine")
    os.remove(entry)
    h.write("victim.txt", b"the user's file")
    os.symlink(h.path("victim.txt"), entry)
    h.freeze()
    _refused_fast(h, _dist_build(h, model, cache))
    r = h.refused(["cache", "verify", "--dir", cache], code="KILN-E7017")
    if "symbolic link" not in r.err:
        raise CaseFailure("verify does not say it is a link: %r" % r)


def case_model_named_as_the_cache_entry(h):
    """The model kept in the cache directory under its own entry's name: read as a corrupt entry,
    it used to be discarded (the model deleted). Refused before anything is read or written."""
    model, cache, key = _key(h)
    entry = os.path.join(cache, key + ".engine")
    os.remove(entry)
    os.rename(model, entry)
    h.freeze()
    h.refused(_dist_build(h, entry, cache), code="KILN-E1012")
    for suffix in (".hb", ".lock"):
        os.rename(entry, os.path.join(cache, key + suffix))
        entry = os.path.join(cache, key + suffix)
        h._before = None
        h.refused(_dist_build(h, entry, cache), code="KILN-E1012")


def case_caches_named_as_cache_files(h):
    model, cache, key = _key(h)
    entry = os.path.join(cache, key + ".engine")
    h.freeze()
    # The timing cache, the calibration cache and the outputs named as the entry or heartbeat.
    h.refused(_dist_build(h, model, cache, extra=["--timing-cache", entry]), code="KILN-E1012")
    h.refused(_dist_build(h, model, cache, extra=["--timing-cache",
                                                  os.path.join(cache, key + ".hb")]),
              code="KILN-E1012")
    h.refused(_dist_build(h, model, cache, extra=["--report", os.path.join(cache, key + ".lock")]),
              code="KILN-E1012")
    h.refused(["build", model, "-o", entry, "--cache-dir", cache] + DIST + PROFILE,
              code="KILN-E1012")


def _big_model(h, rows=4096, cols=8192):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.full((rows, cols), 0.5, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])], [w])
    path = h.path("big.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _signal_during_publish(h, sig):
    model = _big_model(h)
    cache = h.path("cache")
    os.mkdir(cache, 0o700)

    def default_signals():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    p = subprocess.Popen([h.kiln, "build", model, "-o", h.path("out.kiln"), "--cache-dir", cache]
                         + DIST, cwd=h.work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=default_signals)
    seen = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        tmps = [n for n in os.listdir(cache) if ".tmp." in n and ".engine" in n]
        if tmps:
            seen = tmps
            p.send_signal(sig)
            break
        time.sleep(0.001)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise CaseFailure("kiln did not stop within 60 s of %s" % sig.name)
    if seen is None:
        raise CaseFailure("never saw the cache's temporary (rc %s): %s" % (p.returncode,
                                                                          err[-2000:]))
    if p.returncode != -sig:
        raise CaseFailure("expected death by %s, got rc %s" % (sig.name, p.returncode))
    if sig == signal.SIGKILL:
        return model, cache, seen
    left = [n for n in os.listdir(cache) if ".tmp." in n]
    if left:
        raise CaseFailure("cache temporary left behind after %s: %s" % (sig.name, left))


def case_sigkill_during_cache_publish_then_next_publish_cleans_up(h):
    model, cache, seen = _signal_during_publish(h, signal.SIGKILL)
    if not [n for n in os.listdir(cache) if ".tmp." in n and ".engine" in n]:
        raise CaseFailure("SIGKILL left no cache temporary; the case tests nothing (saw %s)" % seen)
    r = h.run(["build", model, "-o", h.path("out.kiln"), "--cache-dir", cache] + DIST,
              timeout=300)
    if r.rc != 0:
        raise CaseFailure("the next build failed: %r" % r)
    left = [n for n in os.listdir(cache) if ".tmp." in n]
    if left:
        raise CaseFailure("the killed writer's temporary is still there: %s" % left)


def case_sigterm_during_cache_publish(h):
    _signal_during_publish(h, signal.SIGTERM)


def case_sigint_during_cache_publish(h):
    _signal_during_publish(h, signal.SIGINT)


def case_user_files_in_the_cache_dir_are_not_entries(h):
    """`kiln cache verify --remove` and `gc` in a directory that also holds a user's TensorRT
    engines (*.engine) and notes: only the cache's own files are judged or removed."""
    model, cache, key = _key(h)
    for name in ("resnet50.engine", ".notes.tmp.old", "plan.takeover.txt"):
        h.write(os.path.join("cache", name), b"the user's")
        old = time.time() - 7200
        os.utime(h.path("cache", name), (old, old))
    h.freeze()
    for args in (["verify", "--remove"], ["verify"], ["gc", "--max-bytes", "0"],
                 ["gc", "--older-than", "1"]):
        r = h.run(["cache"] + args + ["--dir", cache], timeout=60)
        if r.rc >= 128 or r.rc < 0:
            raise CaseFailure("crashed: %r" % r)
        for name in ("resnet50.engine", ".notes.tmp.old", "plan.takeover.txt"):
            if not os.path.exists(h.path("cache", name)):
                raise CaseFailure("cache %s removed the user's %s: %r" % (args, name, r))


if __name__ == "__main__":
    hostile.main(globals())
