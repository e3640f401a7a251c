#!/usr/bin/env python3
"""Weights B for refit: a copy of an ONNX model whose float initializers of more than one element
are scaled by U(0.8, 1.2) and moved by U(0, 0.02) per element (seeded), the same rule as
tests/builder/refit_test.cc; scalars (epsilons, GELU's factors) and integer initializers stay.

  perturb_weights.py MODEL.onnx OUT.onnx [--seed N]
"""
import argparse

import numpy as np
import onnx
from onnx import numpy_helper


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    model = onnx.load(args.model)
    changed = 0
    for i, t in enumerate(model.graph.initializer):
        a = numpy_helper.to_array(t)
        if a.dtype != np.float32 or a.size < 2:
            continue
        b = a * rng.uniform(0.8, 1.2, a.shape).astype(np.float32)
        b += rng.uniform(0.0, 0.02, a.shape).astype(np.float32)
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(b.astype(np.float32), t.name))
        changed += 1
    onnx.save(model, args.out)
    print(f"{args.out}: {changed} initializer(s) perturbed (seed {args.seed})")


if __name__ == "__main__":
    main()
