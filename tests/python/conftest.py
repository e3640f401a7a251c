# Shared fixtures for the Python package's tests: a small MLP with a dynamic batch, its engine on
# the CPU backend, and the C library the build produced (KILN_LIBRARY, set by CTest).
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import kiln  # noqa: E402

PROFILE = {"input_0": ((1, 8), (4, 8), (16, 8))}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="session")
def mlp():
    return Mlp().eval()


@pytest.fixture(scope="session")
def engine(mlp):
    return kiln.build(mlp, torch.randn(4, 8), backend="cpu", profiles=PROFILE,
                      output_names=["logits"])


@pytest.fixture(scope="session")
def onnx_bytes(mlp):
    return kiln._export(mlp, (torch.randn(4, 8),), "torchscript", None, ["logits"], None, None,
                        PROFILE)[0]
