"""Hostile cases for output paths reached through a symbolic link in their directory (issue 17,
files). The rule: such a directory is resolved, not refused, and every check (special file, same
file as an input or another output) applies to the real path; kiln says where it writes. No user
file can be replaced through the link.
"""
import os
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
from hostile import CaseFailure  # noqa: E402

MODEL = "zoo/bert_tiny/model.onnx"
PROFILE = ["--profile", "input_ids:1x8,1x8,1x8", "--profile", "attention_mask:1x8,1x8,1x8",
           "--profile", "token_type_ids:1x8,1x8,1x8"]


def _setup(h):
    os.mkdir(h.path("real"))
    model = h.copy(MODEL, os.path.join("real", "model.onnx"))
    os.symlink(h.path("real"), h.path("via"))
    return model


def case_output_through_a_linked_dir_onto_the_model(h):
    model = _setup(h)
    h.refused(["build", model, "-o", h.path("via", "model.onnx")] + PROFILE, code="KILN-E1012")
    # The model named through the link, the output by its real path.
    h.refused(["build", h.path("via", "model.onnx"), "-o", model] + PROFILE, code="KILN-E1012")


def case_report_and_timing_cache_through_a_linked_dir(h):
    model = _setup(h)
    out = h.path("real", "out.kiln")
    h.write(os.path.join("real", "out.kiln"), b"an older engine")
    h.refused(["build", model, "-o", out, "--report", h.path("via", "out.kiln")] + PROFILE,
              code="KILN-E1012")
    h.refused(["build", model, "-o", h.path("real", "new.kiln"), "--report",
               h.path("via", "new.kiln")] + PROFILE, code="KILN-E1012")
    h.refused(["build", model, "-o", out, "--timing-cache", h.path("via", "model.onnx")] +
              PROFILE, code="KILN-E1012")


def case_output_through_a_link_to_dev(h):
    model = _setup(h)
    os.symlink("/dev", h.path("devdir"))
    for dev in ("null", "full"):
        before = os.stat("/dev/" + dev)
        h.refused(["build", model, "-o", h.path("devdir", dev)] + PROFILE, code="KILN-E1011")
        h.refused(["build", model, "-o", h.path("real", "o.kiln"), "--report",
                   h.path("devdir", dev)] + PROFILE, code="KILN-E1011")
        after = os.stat("/dev/" + dev)
        if (before.st_ino, before.st_rdev, before.st_mode) != (after.st_ino, after.st_rdev,
                                                                after.st_mode):
            raise CaseFailure("/dev/%s was replaced" % dev)


def case_output_through_a_linked_dir_is_written_there_and_said(h):
    model = _setup(h)
    h.freeze()
    r = h.run(["build", model, "-o", h.path("via", "out.kiln")] + PROFILE, timeout=120)
    if r.rc != 0:
        raise CaseFailure("the build failed: %r" % r)
    if "symbolic link" not in r.err or h.path("real") not in r.err:
        raise CaseFailure("kiln did not say the directory is a link and where it writes: %r" % r)
    if not os.path.islink(h.path("via")):
        raise CaseFailure("the directory link was replaced")
    st = os.lstat(h.path("real", "out.kiln"))
    if not stat.S_ISREG(st.st_mode):
        raise CaseFailure("the engine is not a regular file in the real directory")
    h.check_intact(allow_new=("out.kiln",))


def case_output_names_a_directory(h):
    model = _setup(h)
    for out in (h.path("via") + "/", h.path("real", ".."), h.path("via", ".")):
        h.refused(["build", model, "-o", out] + PROFILE, code="KILN-E1011")


def case_cache_dir_through_a_link(h):
    """--cache-dir a link to a directory others can write: judged by the real directory."""
    model = _setup(h)
    os.mkdir(h.path("shared"))
    os.chmod(h.path("shared"), 0o777)
    os.symlink(h.path("shared"), h.path("cachelink"))
    h.refused(["build", model, "-o", h.path("real", "o.kiln"), "--distributed", "--transport",
               "cache", "--cache-dir", h.path("cachelink"), "--rank", "0", "--world-size", "1"]
              + PROFILE, code="KILN-E7010")
    # The cache directory named as the model, or as a device.
    h.refused(["build", model, "-o", h.path("real", "o.kiln"), "--distributed", "--transport",
               "cache", "--cache-dir", model, "--rank", "0", "--world-size", "1"] + PROFILE)
    h.refused(["cache", "ls", "--dir", "/dev/null"])


if __name__ == "__main__":
    hostile.main(globals())
