"""Second adversarial sweep over the CLI (issue 17): what still destroyed a file, hung or accepted
nonsense after the first round of fixes. conformance --json over a case's own files (the cases run
in child processes, so the parent never read them); monitor's metrics file over the NVML library
it loads, and a FIFO as that library (dlopen waits on it); shapes with a trailing 'x'.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
from hostile import CaseFailure  # noqa: E402

CASE = "zoo/bert_tiny"
PROFILE = ["--profile", "input_ids:1x8,1x8,1x8", "--profile", "attention_mask:1x8,1x8,1x8",
           "--profile", "token_type_ids:1x8,1x8,1x8"]


def _case_dir(h):
    dst = h.path("cases", "bert_tiny")
    shutil.copytree(os.path.join(h.src, CASE), dst)
    return h.path("cases")


def case_conformance_json_over_a_case_file(h):
    cases = _case_dir(h)
    h.write("expected.txt", b"bert_tiny\n")
    h.freeze()
    for victim in (os.path.join(cases, "bert_tiny", "model.onnx"),
                   os.path.join(cases, "bert_tiny", "test_data_set_0", "input_0.pb")):
        h.refused(["conformance", cases, "--json", victim], code="KILN-E1012", timeout=120)
    h.refused(["conformance", cases, "--expected", h.path("expected.txt"), "--json",
               h.path("expected.txt")], code="KILN-E1012", timeout=120)


def case_monitor_metrics_file_over_its_nvml_library(h):
    h.write("libfake.so", b"not a library, but the user's file")
    h.refused(["monitor", "--nvml-library", h.path("libfake.so"), "--no-server",
               "--metrics-file", h.path("libfake.so"), "--duration", "1"], code="KILN-E1012",
              timeout=30)


def case_monitor_nvml_library_fifo(h):
    os.mkfifo(h.path("libnvml.so"))
    h.refused(["monitor", "--nvml-library", h.path("libnvml.so"), "--no-server",
               "--metrics-file", h.path("m.prom"), "--duration", "1"], code="KILN-E1009",
              timeout=20)


def case_shape_with_a_trailing_x(h):
    model = h.copy(CASE + "/model.onnx", "model.onnx")
    engine = h.path("model.kiln")
    r = h.run(["build", model, "-o", engine] + PROFILE, timeout=120)
    if r.rc != 0:
        raise CaseFailure("build failed: %r" % r)
    h.freeze()
    for spec in ("input_ids:1x8x", "input_ids:1x8x,1x8,1x8"):
        h.refused(["run", engine, "--shapes", spec, "--iterations", "1"], code="KILN-E3000")
        h.refused(["build", model, "-o", h.path("o.kiln"), "--profile", spec.replace(
            "input_ids:1x8x", "input_ids:1x8x,1x8,1x8") if "," not in spec else spec] +
            PROFILE[2:], code="KILN-E3000")


if __name__ == "__main__":
    hostile.main(globals())
