"""Hostile cases for the builder's optimisation level (issue 19): out-of-range or malformed
--opt-level values are clean catalog refusals that build nothing and touch no file."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402


def case_opt_level_out_of_range(h):
    h.copy("zoo/resnet_tiny/model.onnx", "model.onnx")
    for level in ["6", "-1", "99999999999999999999", "nan", "2.5", ""]:
        h.refused(["build", h.path("model.onnx"), "-o", h.path("out.kiln"), "--opt-level", level],
                  code="KILN-E1016")
        assert not os.path.exists(h.path("out.kiln")), level


if __name__ == "__main__":
    hostile.main(globals())
