# Run by test_fast.py under other CPython versions (3.9 to 3.13, without torch): the one abi3
# kiln._fast binary loads there and runs an engine, given stand-in tensors over ctypes memory.
# Usage: PYTHON fast_abi_check.py MODEL.onnx   (KILN_LIBRARY set); prints one JSON line.
import ctypes
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import kiln  # noqa: E402
from kiln import _lib  # noqa: E402

STRIDED = object()
FLOAT32 = object()


class Device:
    type, index = "cpu", None

    def __eq__(self, other):
        return isinstance(other, Device)

    def __hash__(self):
        return 0


class Tensor:
    """What kiln._fast reads of a torch tensor, over a ctypes float array."""
    layout, dtype = STRIDED, FLOAT32

    def __init__(self, shape):
        self.shape = tuple(shape)
        n = 1
        for d in self.shape:
            n *= d
        self.buf = (ctypes.c_float * n)()
        self.device = Device()

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def stride(self):
        strides, step = [], 1
        for d in reversed(self.shape):
            strides.insert(0, step)
            step *= d
        return tuple(strides)


def main():
    engine = kiln.build(sys.argv[1], backend="cpu")
    ctx = engine.create_execution_context()
    assert ctx._fast is None  # no torch here: the package itself makes no runner
    stand_in = types.SimpleNamespace(Tensor=Tensor, strided=STRIDED,
                                     empty=lambda shape, dtype, device: Tensor(shape))
    names = ([t.name for t in engine.inputs], [t.name for t in engine.outputs])
    runner = _lib.fast.Runner(ctx._h.value, _lib.fast_functions(), tuple(names[0]),
                              tuple(names[1]), (FLOAT32,), {FLOAT32: _lib.DTYPE_FLOAT32},
                              kiln._raise_status, stand_in)
    x = Tensor(engine.inputs[0].shape)
    for i in range(len(x.buf)):
        x.buf[i] = (i - 4) / 4
    y = Tensor((1, engine.outputs[0].shape[1]))
    result = runner.run([x], {names[1][0]: y}, None)
    assert result[names[1][0]] is y
    z = runner.call((x,))  # its output made by the stand-in torch.empty
    try:
        runner.run([Tensor((2, 8))], None, None)
        error = None
    except kiln.KilnError as e:
        error = e.code
    print(json.dumps({"python": sys.version.split()[0], "origin": _lib.fast_origin,
                      "runs": runner.runs, "run": list(y.buf), "call": list(z.buf),
                      "error": error}))


if __name__ == "__main__":
    main()
