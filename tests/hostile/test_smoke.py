"""Hostile-suite smoke case: the harness itself, on an input kiln already refuses."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402


def case_not_a_model(h):
    h.write("model.onnx", b"\x00garbage" * 64)
    h.refused(["build", h.path("model.onnx"), "-o", h.path("out.kiln")])


if __name__ == "__main__":
    hostile.main(globals())
