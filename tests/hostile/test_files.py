"""Hostile cases for kiln's files (issue 17, parts 2 and 4): special files as inputs and outputs,
outputs that are inputs, signals during a write, stale temporaries, and the trust kiln places in
engine files and the engine cache."""
import os
import signal
import socket
import stat
import subprocess
import sys
import time

# The cases that make models need onnx and numpy: when this interpreter lacks them (a pyenv
# python found first on PATH), run under Debian's, which has both.
try:
    import numpy  # noqa: F401
    import onnx  # noqa: F401
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath(
            "/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
from hostile import CaseFailure  # noqa: E402

MODEL = "zoo/bert_tiny/model.onnx"
# bert_tiny's inputs are [batch, seq]: one fixed shape is enough here.
PROFILE = ["--profile", "input_ids:1x8,1x8,1x8", "--profile", "attention_mask:1x8,1x8,1x8",
           "--profile", "token_type_ids:1x8,1x8,1x8"]


def _model(h):
    return h.copy(MODEL, "model.onnx")


def _build_ok(h, args, timeout=120):
    r = h.run(["build"] + args, timeout=timeout)
    if r.rc != 0:
        raise CaseFailure("build failed: %r" % r)
    return r


def _tmp_files(folder):
    return sorted(n for n in os.listdir(folder) if ".tmp" in n)


def _big_model(h, name="big.onnx", rows=4096, cols=8192):
    """A MatMul with a rows x cols float weight (128 MiB by default): its engine takes long enough
    to write that a signal lands during the write."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.full((rows, cols), 0.5, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = h.path(name)
    onnx.save(m, path)
    return path


def _external_model(h):
    """A model whose one weight lives in weights.bin beside it."""
    import onnx
    from onnx import TensorProto, helper
    w = TensorProto()
    w.name = "w"
    w.data_type = TensorProto.FLOAT
    w.dims.extend([4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = h.path("ext.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


# ---- special files as inputs -----------------------------------------------------------------

def case_fifo_model(h):
    os.mkfifo(h.path("model.onnx"))
    h.refused(["build", h.path("model.onnx"), "-o", h.path("out.kiln")], code="KILN-E1009",
              timeout=20)


def case_fifo_engine(h):
    os.mkfifo(h.path("model.kiln"))
    h.refused(["run", h.path("model.kiln")], code="KILN-E1009", timeout=20)
    h.refused(["inspect", h.path("model.kiln")], code="KILN-E1009", timeout=20)


def case_fifo_external_data(h):
    model = _external_model(h)
    with open(h.path("weights.bin"), "wb") as f:
        f.write(b"\0" * 16)
    _build_ok(h, [model, "-o", h.path("ok.kiln")])  # the model itself is fine
    os.remove(h.path("ok.kiln"))
    os.remove(h.path("weights.bin"))
    os.mkfifo(h.path("weights.bin"))
    r = h.refused(["build", model, "-o", h.path("out.kiln")], code="KILN-E1009", timeout=20)
    if "weights.bin" not in r.err:
        raise CaseFailure("the error does not name the external data file: %r" % r)


def case_timing_cache_dev_full(h):
    model = _model(h)
    before = os.stat("/dev/full")
    h.refused(["build", model, "-o", h.path("out.kiln"), "--timing-cache", "/dev/full"],
              code="KILN-E1009", timeout=20)
    after = os.stat("/dev/full")
    if (before.st_ino, before.st_rdev, before.st_mode) != (after.st_ino, after.st_rdev,
                                                            after.st_mode):
        raise CaseFailure("/dev/full was replaced")


def case_timing_cache_fifo(h):
    model = _model(h)
    os.mkfifo(h.path("cache.json"))
    h.refused(["build", model, "-o", h.path("out.kiln"), "--timing-cache", h.path("cache.json")],
              code="KILN-E1009", timeout=20)


def case_calibration_cache_dev_zero(h):
    model = _model(h)
    h.refused(["build", model, "-o", h.path("out.kiln"), "--int8", "--calib-cache", "/dev/zero"],
              code="KILN-E1009", timeout=20)


# ---- outputs that are inputs or other outputs ------------------------------------------------

def case_output_is_the_model(h):
    model = _model(h)
    h.refused(["build", model, "-o", model], code="KILN-E1012")


def case_output_is_the_model_by_another_name(h):
    model = _model(h)
    os.link(model, h.path("hardlink.kiln"))
    h.refused(["build", model, "-o", h.path("hardlink.kiln")], code="KILN-E1012")
    h.refused(["build", model, "-o", os.path.join(h.work, ".", "model.onnx")], code="KILN-E1012")


def case_report_is_the_output(h):
    model = _model(h)
    h.write("out.kiln", b"an older engine")
    h.refused(["build", model, "-o", h.path("out.kiln"), "--report", h.path("out.kiln")],
              code="KILN-E1012")


def case_report_is_the_model(h):
    model = _model(h)
    h.refused(["build", model, "-o", h.path("out.kiln"), "--report", model], code="KILN-E1012")


def case_output_is_the_timing_cache(h):
    model = _model(h)
    h.write("cache.json", b'{"format": "kiln-timing-cache-v1"}')
    h.refused(["build", model, "-o", h.path("cache.json"), "--timing-cache", h.path("cache.json")],
              code="KILN-E1012")


def case_timing_cache_is_the_model(h):
    model = _model(h)
    h.refused(["build", model, "-o", h.path("out.kiln"), "--timing-cache", model],
              code="KILN-E1012")


def case_external_data_as_output(h):
    """-o naming the model's external data: refused when it would be replaced (the library's
    check, after the build read it)."""
    model = _external_model(h)
    with open(h.path("weights.bin"), "wb") as f:
        f.write(b"\0" * 16)
    h.refused(["build", model, "-o", h.path("weights.bin")], code="KILN-E1012")


# ---- outputs that are not regular files ------------------------------------------------------

def case_output_fifo(h):
    model = _model(h)
    os.mkfifo(h.path("out.kiln"))
    h.refused(["build", model, "-o", h.path("out.kiln")], code="KILN-E1011", timeout=20)


def case_output_symlink(h):
    model = _model(h)
    h.write("target.kiln", b"the link's target")
    os.symlink(h.path("target.kiln"), h.path("out.kiln"))
    r = h.refused(["build", model, "-o", h.path("out.kiln")], code="KILN-E1011")
    if "symbolic link" not in r.err:
        raise CaseFailure("the error does not say the output is a link: %r" % r)


def case_report_symlink(h):
    model = _model(h)
    h.write("target.json", b"keep")
    os.symlink(h.path("target.json"), h.path("report.json"))
    h.refused(["build", model, "-o", h.path("out.kiln"), "--report", h.path("report.json")],
              code="KILN-E1011")


def case_output_char_device(h):
    model = _model(h)
    if os.geteuid() == 0:  # a device node of our own in the case folder (the snapshot checks it)
        os.mknod(h.path("dev.kiln"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
        h.refused(["build", model, "-o", h.path("dev.kiln")], code="KILN-E1011")
    for dev in ("/dev/null", "/dev/full"):
        before = os.stat(dev)
        h.refused(["build", model, "-o", dev], code="KILN-E1011")
        h.refused(["build", model, "-o", h.path("out.kiln"), "--report", dev], code="KILN-E1011")
        after = os.stat(dev)
        if (before.st_ino, before.st_rdev, before.st_mode) != (after.st_ino, after.st_rdev,
                                                                after.st_mode):
            raise CaseFailure("%s was replaced" % dev)


def case_output_directory(h):
    model = _model(h)
    os.mkdir(h.path("out.kiln"))
    h.refused(["build", model, "-o", h.path("out.kiln")], code="KILN-E1011")


# ---- signals during a write and stale temporaries --------------------------------------------

def _signal_during_write(h, sig):
    """Starts a build of a large engine, waits until its temporary appears, sends `sig`."""
    model = _big_model(h)
    out = h.path("out.kiln")
    with open(out, "wb") as f:
        f.write(b"the engine of yesterday")
    def default_signals():  # a background shell may have left SIGINT ignored for its children
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    p = subprocess.Popen([h.kiln, "build", model, "-o", out], cwd=h.work,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=default_signals)
    seen = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        tmps = _tmp_files(h.work)
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
        raise CaseFailure("never saw the temporary (rc %s): %s" % (p.returncode, err[-2000:]))
    return p.returncode, seen, out


def _check_signal_case(h, sig):
    rc, seen, out = _signal_during_write(h, sig)
    # Documented: the handler removes the temporaries, then the signal ends kiln as it would
    # have (the parent sees the signal; a shell reports 128+N).
    if rc != -sig:
        raise CaseFailure("expected death by %s after cleanup, got rc %s" % (sig.name, rc))
    left = _tmp_files(h.work)
    if left:
        raise CaseFailure("temporary left behind after %s: %s (saw %s)" % (sig.name, left, seen))
    with open(out, "rb") as f:
        if f.read() != b"the engine of yesterday":
            raise CaseFailure("the previous engine was changed by an interrupted write")


def case_sigterm_during_write(h):
    _check_signal_case(h, signal.SIGTERM)


def case_sigint_during_write(h):
    _check_signal_case(h, signal.SIGINT)


def case_sigkill_then_next_write_cleans_up(h):
    rc, seen, out = _signal_during_write(h, signal.SIGKILL)
    if rc != -signal.SIGKILL:
        raise CaseFailure("expected SIGKILL, got rc %s" % rc)
    if not _tmp_files(h.work):
        raise CaseFailure("SIGKILL left no temporary; the case tests nothing (saw %s)" % seen)
    # The next write to the same path removes the dead writer's temporary.
    _build_ok(h, [h.copy(MODEL, "model.onnx"), "-o", out] + PROFILE)
    left = _tmp_files(h.work)
    if left:
        raise CaseFailure("stale temporary not removed by the next write: %s" % left)


def case_stale_temporary_of_dead_pid_is_removed(h):
    model = _model(h)
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    stale = "out.kiln.tmp.%d.%s.0" % (dead.pid, host)
    h.write(stale, b"x" * 4096)
    alive = "out.kiln.tmp.%d.%s.0" % (os.getpid(), host)  # this script lives: kept
    h.write(alive, b"y")
    _build_ok(h, [model, "-o", h.path("out.kiln")] + PROFILE)
    if os.path.exists(h.path(stale)):
        raise CaseFailure("the dead writer's temporary is still there")
    if not os.path.exists(h.path(alive)):
        raise CaseFailure("a live writer's temporary was removed")
    os.remove(h.path(alive))


# ---- engine header trust ---------------------------------------------------------------------

def _flipped_engine(h, offset, bit=0x01):
    model = _model(h)
    engine = h.path("model.kiln")
    _build_ok(h, [model, "-o", engine] + PROFILE)
    with open(engine, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ bit]))
    return engine


def case_engine_version_byte_flipped(h):
    for value in (0x01, 0x02, 0x04):  # format 2 becomes 3, 0 or 6
        engine = _flipped_engine(h, 4, value)
        h.freeze()
        h.refused(["run", engine], code="KILN-E4002")
        h.refused(["inspect", engine], code="KILN-E4002")
        os.remove(engine)
        h._before = None


def case_engine_header_bytes_48_to_63_flipped(h):
    for offset in (48, 55, 63):
        engine = _flipped_engine(h, offset)
        h.freeze()
        h.refused(["run", engine], code="KILN-E4002")
        os.remove(engine)
        h._before = None


# ---- engine cache trust ----------------------------------------------------------------------

def case_world_writable_cache_dir_refused(h):
    d = h.path("cache")
    os.mkdir(d)
    os.chmod(d, 0o777)
    for sub in ("ls", "verify", "gc"):
        r = h.refused(["cache", sub, "--dir", d], code="KILN-E7010")
        if "--trust-shared-cache" not in r.err:
            raise CaseFailure("the refusal does not name the option: %r" % r)
    os.chmod(d, 0o775)
    h.refused(["cache", "ls", "--dir", d], code="KILN-E7010")
    # Accepted on request (a warning), and a sticky directory is accepted as it is.
    r = h.run(["cache", "ls", "--dir", d, "--trust-shared-cache"])
    if r.rc != 0 or "KILN-E7010" not in r.err:
        raise CaseFailure("--trust-shared-cache should open it with a warning: %r" % r)
    os.chmod(d, 0o1777)
    r = h.run(["cache", "ls", "--dir", d])
    if r.rc != 0:
        raise CaseFailure("a sticky directory should be accepted: %r" % r)


def _cache_entry(h, d):
    """Publishes one entry through a single-rank distributed build; returns its path."""
    model = _model(h)
    r = h.run(["build", model, "-o", h.path("dist.kiln"), "--distributed", "--transport", "cache",
               "--cache-dir", d, "--rank", "0", "--world-size", "1"] + PROFILE, timeout=120)
    if r.rc != 0:
        raise CaseFailure("distributed build into the cache failed: %r" % r)
    entries = [n for n in os.listdir(d) if n.endswith(".engine")]
    if len(entries) != 1:
        raise CaseFailure("expected one cache entry, found %s" % os.listdir(d))
    os.remove(h.path("dist.kiln"))
    return os.path.join(d, entries[0])


def case_cache_entry_version_flipped(h):
    d = h.path("cache")
    os.mkdir(d, 0o700)
    entry = _cache_entry(h, d)
    with open(entry, "r+b") as f:
        f.seek(8)  # the entry header's u32 version, after the 8-byte magic
        f.write(b"\x02")
    h.freeze()
    r = h.refused(["cache", "verify", "--dir", d], code="KILN-E7008")
    if "entry format 2" not in r.err:
        raise CaseFailure("the refusal does not name the version: %r" % r)


def case_cache_entry_writable_by_others_refused(h):
    d = h.path("cache")
    os.mkdir(d, 0o700)
    entry = _cache_entry(h, d)
    os.chmod(entry, 0o666)
    h.freeze()
    h.refused(["build", h.path("model.onnx"), "-o", h.path("dist.kiln"), "--distributed",
               "--transport", "cache", "--cache-dir", d, "--rank", "0", "--world-size", "1"] +
              PROFILE, code="KILN-E7017")
    h.refused(["cache", "verify", "--dir", d], code="KILN-E7017")


if __name__ == "__main__":
    hostile.main(globals())
