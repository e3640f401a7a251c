"""kiln inside PyTorch: build engines from ONNX or a torch.nn.Module, save and load them, and run
them on torch tensors without copies.

The C++ library is the one implementation; this package converts Python values to the C API
(libkiln_c.so, src/kiln/api/kiln_c.h) and back. Every error is a KilnError carrying the catalog
code, the message and the remedy.
"""
from __future__ import annotations

import ctypes
import io
import json
import os
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _lib
from ._lib import lib

__all__ = [
    "KilnError", "Engine", "ExecutionContext", "TensorInfo", "build", "load", "deserialize",
    "version", "distributed",
]


class KilnError(RuntimeError):
    """A kiln failure: `code` ("KILN-E5001"), `number` (5001), `name` ("InputTypeMismatch"),
    `message` (what happened) and `remedy` (what to do), all from the one error catalog."""

    def __init__(self, number: int, code: str, name: str, message: str, remedy: str):
        self.number = number
        self.code = code
        self.name = name
        self.message = message
        self.remedy = remedy
        super().__init__(f"{code} {name}: {message}\n  remedy: {remedy}")


def _raise_status(status: Optional[int]) -> None:
    """Raises the kiln_status* as a KilnError (and frees it); nothing for NULL (success)."""
    if not status:
        return
    try:
        err = KilnError(lib.kiln_status_code(status), lib.kiln_status_id(status).decode(),
                        lib.kiln_status_name(status).decode(),
                        lib.kiln_status_message(status).decode(errors="replace"),
                        lib.kiln_status_remedy(status).decode(errors="replace"))
    finally:
        lib.kiln_status_free(status)
    raise err


def _error(number: int, message: str) -> KilnError:
    """A KilnError for a check made here, with the catalog's name and remedy for `number`."""
    try:
        _raise_status(lib.kiln_status_make(number, message.encode()))
    except KilnError as e:
        return e
    raise AssertionError("kiln_status_make returned success")


def version() -> str:
    return lib.kiln_version().decode()


# ---- tensors --------------------------------------------------------------------------------

_TORCH = None


def _torch():
    global _TORCH
    if _TORCH is None:
        import torch  # imported on use: building from ONNX needs no torch
        _TORCH = torch
    return _TORCH


def _current_raw_stream():
    """torch's getter of the current CUDA stream's handle by device index, or None."""
    return getattr(_torch()._C, "_cuda_getCurrentRawStream", None)


_DTYPE_CODES: Dict[Any, int] = {}
_CODE_DTYPES: Dict[int, Any] = {}


def _dtype_tables():
    if not _DTYPE_CODES:
        torch = _torch()
        pairs = [(torch.float32, _lib.DTYPE_FLOAT32), (torch.float16, _lib.DTYPE_FLOAT16),
                 (torch.bfloat16, _lib.DTYPE_BFLOAT16), (torch.int8, _lib.DTYPE_INT8),
                 (torch.uint8, _lib.DTYPE_UINT8), (torch.int32, _lib.DTYPE_INT32),
                 (torch.int64, _lib.DTYPE_INT64), (torch.bool, _lib.DTYPE_BOOL),
                 (torch.float64, _lib.DTYPE_FLOAT64), (torch.int16, _lib.DTYPE_INT16)]
        # torch has uint16/32/64 since 2.3 (with few kernels); older versions lack them.
        for name, c in (("uint16", _lib.DTYPE_UINT16), ("uint32", _lib.DTYPE_UINT32),
                        ("uint64", _lib.DTYPE_UINT64)):
            if hasattr(torch, name):
                pairs.append((getattr(torch, name), c))
        for t, c in pairs:
            _DTYPE_CODES[t] = c
            _CODE_DTYPES[c] = t
    return _DTYPE_CODES, _CODE_DTYPES


_DTYPE_NAMES = {1: "float32", 2: "float16", 3: "bfloat16", 4: "int8", 5: "uint8", 6: "int32",
                7: "int64", 8: "bool", 9: "float64", 10: "int16", 11: "uint16", 12: "uint32",
                13: "uint64"}


class TensorInfo(NamedTuple):
    """An engine input or output: dims are -1 where dynamic; profile is (min, opt, max) for
    dynamic inputs."""
    name: str
    dtype: Any  # a torch.dtype when torch is importable, else the dtype's name
    shape: Tuple[int, ...]
    is_input: bool
    profile: Optional[Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]]


class _Slot:
    """One binding's kiln_tensor, reused run after run (the hot path allocates no ctypes
    structs)."""

    def __init__(self, name: str):
        self.name = name.encode()
        self.dims = (ctypes.c_int64 * _lib.KILN_MAX_DIMS)()
        self.strides = (ctypes.c_int64 * _lib.KILN_MAX_DIMS)()
        self.tensor = _lib.Tensor()
        self.tensor.dims = ctypes.cast(self.dims, ctypes.POINTER(ctypes.c_int64))
        self.tensor.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        self.ref = ctypes.byref(self.tensor)
        self.key = None  # what ExecutionContext.run bound here last

    def fill(self, t) -> None:
        codes, _ = _dtype_tables()
        dtype = codes.get(t.dtype)
        if dtype is None:
            raise _error(5001, f"tensor '{self.name.decode()}' has dtype {t.dtype}, which kiln "
                         "engines do not take (float32, float16, bfloat16, int8, uint8, int32, "
                         "int64, bool)")
        if t.layout != _torch().strided:
            raise _error(5013, f"tensor '{self.name.decode()}' has layout {t.layout}; kiln takes "
                         "dense (strided) tensors")
        shape = t.shape
        if len(shape) > _lib.KILN_MAX_DIMS:
            raise _error(5003, f"tensor '{self.name.decode()}' has rank {len(shape)}")
        dev = t.device
        ti = self.tensor
        ti.data = t.data_ptr()
        ti.dtype = dtype
        ti.ndim = len(shape)
        for i, (d, s) in enumerate(zip(shape, t.stride())):
            self.dims[i] = d
            self.strides[i] = s
        ti.device_type = (_lib.DEVICE_CPU if dev.type == "cpu" else
                          _lib.DEVICE_CUDA if dev.type == "cuda" else 0)
        ti.device_id = dev.index or 0


# ---- engines ----------------------------------------------------------------------------------

class Engine:
    """A built or loaded engine: immutable, shared by its execution contexts."""

    def __init__(self, handle: int):
        self._h = ctypes.c_void_p(handle)
        self.backend: str = lib.kiln_engine_backend(self._h).decode()
        self.arch: str = lib.kiln_engine_arch(self._h).decode()
        infos = []
        data_dependent = []
        for i in range(lib.kiln_engine_num_bindings(self._h)):
            name = ctypes.c_char_p()
            is_input = ctypes.c_int()
            dtype = ctypes.c_int32()
            ndim = ctypes.c_int32()
            dims = (ctypes.c_int64 * _lib.KILN_MAX_DIMS)()
            _raise_status(lib.kiln_engine_binding(self._h, i, ctypes.byref(name),
                                                  ctypes.byref(is_input), ctypes.byref(dtype),
                                                  ctypes.byref(ndim), dims))
            n = name.value.decode()
            profile = self._profile(n) if is_input.value else None
            try:
                dt = _dtype_tables()[1].get(dtype.value)
            except ImportError:
                dt = _DTYPE_NAMES.get(dtype.value)
            infos.append(TensorInfo(n, dt, tuple(dims[:ndim.value]), bool(is_input.value),
                                    profile))
            mask = ctypes.c_uint32()
            _raise_status(lib.kiln_engine_binding_data_dependent(self._h, i, ctypes.byref(mask)))
            if mask.value:
                data_dependent.append(n)
        # Outputs with a dim that follows from tensor values (NonZero's count...): bound at their
        # bound, returned cut to the dims each run reports.
        self.data_dependent_outputs: Tuple[str, ...] = tuple(data_dependent)
        self.inputs: Tuple[TensorInfo, ...] = tuple(t for t in infos if t.is_input)
        self.outputs: Tuple[TensorInfo, ...] = tuple(t for t in infos if not t.is_input)

    def _profile(self, name: str):
        has = ctypes.c_int()
        ndim = ctypes.c_int32()
        arrays = [(ctypes.c_int64 * _lib.KILN_MAX_DIMS)() for _ in range(3)]
        _raise_status(lib.kiln_engine_profile(self._h, name.encode(), ctypes.byref(has),
                                              ctypes.byref(ndim), *arrays))
        if not has.value:
            return None
        return tuple(tuple(a[:ndim.value]) for a in arrays)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is not None and h.value:
            lib.kiln_engine_free(h)
            self._h = None

    @property
    def report(self) -> Dict[str, Any]:
        """The build report (`kiln build --report`'s JSON) as a dict."""
        buf = ctypes.c_void_p()
        _raise_status(lib.kiln_engine_report_json(self._h, ctypes.byref(buf)))
        return json.loads(_lib.take_buffer(buf) or b"{}")

    def serialize(self, strip_weights: bool = False) -> bytes:
        """The engine's bytes. strip_weights: without the weights its weight program remakes from
        the model (layers, tactics, plan and program only): for caches and for ranks that hold
        the model; kiln.deserialize(data, weights=...) loads them again."""
        buf = ctypes.c_void_p()
        serialize = lib.kiln_engine_serialize_stripped if strip_weights else \
            lib.kiln_engine_serialize
        _raise_status(serialize(self._h, ctypes.byref(buf)))
        return _lib.take_buffer(buf)

    def save(self, path: Union[str, os.PathLike], strip_weights: bool = False) -> None:
        """Writes the .kiln file atomically (strip_weights: as for serialize; kiln.load(path,
        weights=...) loads it)."""
        save = lib.kiln_engine_save_stripped if strip_weights else lib.kiln_engine_save
        _raise_status(save(self._h, os.fsencode(path)))

    def create_execution_context(self, cuda_graphs: bool = True) -> "ExecutionContext":
        return ExecutionContext(self, cuda_graphs)

    def refit(self, weights) -> Dict[str, Any]:
        """Puts new weights into this engine without a rebuild (docs/refit.md): same layers, same
        tactics, the constants a fresh build with these weights would make.

        `weights`: an ONNX model (a path, its bytes or an onnx.ModelProto) or a mapping from
        initializer name to a tensor (a PyTorch state_dict whose names are the ONNX initializers',
        numpy arrays, anything numpy.asarray takes). Every initializer the engine was built from
        must be given, with its dtype and shape, and nothing else (a state_dict's buffers that the
        export dropped, such as BatchNorm's num_batches_tracked, are extra: leave them out).

        Every execution context of the engine takes the new weights at its next run, never in the
        middle of one; save() and serialize() then give the refit engine. Wrong weights raise
        KilnError (KILN-E4008 naming the first missing, extra or mismatched initializer; KILN-E4009
        for an initializer whose value shaped the engine) and leave the engine as it was. Returns
        the refit report (constants replaced, steps replayed, seconds, the new `generation`)."""
        buf = ctypes.c_void_p()
        if isinstance(weights, (str, os.PathLike)):
            _raise_status(lib.kiln_engine_refit_from_file(self._h, os.fsencode(weights),
                                                          ctypes.byref(buf)))
        elif isinstance(weights, (bytes, bytearray, memoryview)) or hasattr(
                weights, "SerializeToString"):
            data = bytes(weights) if not hasattr(weights, "SerializeToString") else \
                weights.SerializeToString()
            _raise_status(lib.kiln_engine_refit_from_bytes(self._h, data, len(data),
                                                           ctypes.byref(buf)))
        elif isinstance(weights, Mapping):
            named, keep = _named_tensors(weights)
            _raise_status(lib.kiln_engine_refit(self._h, named, len(keep), ctypes.byref(buf)))
        else:
            raise _error(1001, f"weights is a {type(weights).__name__}: give an ONNX path, ONNX "
                         "bytes, an onnx.ModelProto or a mapping from initializer name to tensor "
                         "(a state_dict)")
        return json.loads(_lib.take_buffer(buf))

    @property
    def weights_generation(self) -> int:
        """0 as built or loaded; +1 per refit."""
        return lib.kiln_engine_weights_generation(self._h)

    def __repr__(self) -> str:
        return (f"kiln.Engine(backend={self.backend!r}, arch={self.arch!r}, "
                f"inputs={[t.name for t in self.inputs]}, outputs={[t.name for t in self.outputs]})")


_NUMPY_DTYPES = {"float32": _lib.DTYPE_FLOAT32, "float16": _lib.DTYPE_FLOAT16,
                 "int8": _lib.DTYPE_INT8, "uint8": _lib.DTYPE_UINT8, "int32": _lib.DTYPE_INT32,
                 "int64": _lib.DTYPE_INT64, "bool": _lib.DTYPE_BOOL,
                 "float64": _lib.DTYPE_FLOAT64, "int16": _lib.DTYPE_INT16,
                 "uint16": _lib.DTYPE_UINT16, "uint32": _lib.DTYPE_UINT32,
                 "uint64": _lib.DTYPE_UINT64}


def _host_weight(name: str, value):
    """A refit weight as (owner, address, dtype code, shape): dense host memory that `owner`
    keeps alive. torch tensors are detached, moved to the CPU and made contiguous; anything else
    goes through numpy.asarray."""
    torch = _TORCH or sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        code = _dtype_tables()[0].get(t.dtype)
        if code is None:
            raise _error(4008, f"weight '{name}' has dtype {t.dtype}, which no kiln engine's "
                         "initializer has (float32, float16, bfloat16, int8, uint8, int32, int64, "
                         "bool): convert it to the dtype of the model's initializer")
        return t, t.data_ptr(), code, tuple(t.shape)
    import numpy
    a = numpy.ascontiguousarray(numpy.asarray(value))
    code = _NUMPY_DTYPES.get(a.dtype.name)
    if code is None:
        raise _error(4008, f"weight '{name}' has dtype {a.dtype.name}, which no kiln engine's "
                     "initializer has (float32, float16, int8, uint8, int32, int64, bool): convert "
                     "it to the dtype of the model's initializer")
    return a, a.ctypes.data, code, a.shape


def _named_tensors(weights: Mapping[str, Any]):
    """A mapping name -> tensor as a kiln_named_tensor array, and what keeps its memory alive."""
    keep = []
    array = (_lib.NamedTensor * max(len(weights), 1))()
    for i, (name, value) in enumerate(weights.items()):
        if not isinstance(name, str):
            raise _error(1001, f"weight names are initializer names (str), not {name!r}")
        owner, address, code, shape = _host_weight(name, value)
        encoded = name.encode()
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        keep.append((owner, encoded, dims))
        entry = array[i]
        entry.name = encoded
        entry.tensor.data = address
        entry.tensor.dtype = code
        entry.tensor.ndim = len(shape)
        entry.tensor.dims = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
        entry.tensor.strides = None
        entry.tensor.device_type = _lib.DEVICE_CPU
        entry.tensor.device_id = 0
    return array, keep


def _refit_weights(weights, others):
    """ONNX bytes, an onnx.ModelProto or a mapping from initializer name to tensor as a
    kiln_refit_weights: (the struct, what keeps its memory alive). `others` ends the error's list
    of what may be given after "an ONNX path, ONNX bytes, "."""
    w = _lib.RefitWeights()
    if hasattr(weights, "SerializeToString"):
        weights = weights.SerializeToString()
    if isinstance(weights, (bytes, bytearray, memoryview)):
        keep = bytes(weights)
        w.onnx = keep
        w.onnx_size = len(keep)
    elif isinstance(weights, Mapping):
        named, owners = _named_tensors(weights)
        keep = (named, owners)
        w.tensors = named
        w.count = len(owners)
    else:
        raise _error(1001, f"weights is a {type(weights).__name__}: give an ONNX path, ONNX "
                     f"bytes, {others}")
    return w, keep


def _weights_source(weights):
    """Engine weights for kiln_engine_*_with_weights: (onnx_path or None, kiln_refit_weights or
    None, what keeps their memory alive)."""
    if isinstance(weights, (str, os.PathLike)):
        return os.fsencode(weights), None, None
    w, keep = _refit_weights(weights, "an onnx.ModelProto or a mapping from initializer name to "
                             "tensor (a state_dict)")
    return None, ctypes.byref(w), (w, keep)


def load(path: Union[str, os.PathLike], weights=None) -> Engine:
    """Loads a .kiln file for the backend it was built for.

    `weights` (as Engine.refit takes them: an ONNX path, ONNX bytes, an onnx.ModelProto or a
    mapping from initializer name to tensor) fill the engine before it is loaded. A weight-stripped
    engine (`kiln build --strip-weights`: no weight bytes in the file) needs them, and without
    them raises KilnError KILN-E4010; the result is the engine a build of those weights makes
    (save() writes the full engine). Wrong weights raise what Engine.refit raises (KILN-E4008
    naming the first mismatch)."""
    h = ctypes.c_void_p()
    if weights is None:
        _raise_status(lib.kiln_engine_load(os.fsencode(path), ctypes.byref(h)))
    else:
        onnx_path, w, keep = _weights_source(weights)
        _raise_status(lib.kiln_engine_load_with_weights(os.fsencode(path), onnx_path, w,
                                                        ctypes.byref(h), None))
        del keep
    return Engine(h.value)


def deserialize(data: bytes, weights=None) -> Engine:
    """Loads engine bytes (Engine.serialize's); `weights` as for load()."""
    h = ctypes.c_void_p()
    data = bytes(data)
    if weights is None:
        _raise_status(lib.kiln_engine_deserialize(data, len(data), ctypes.byref(h)))
    else:
        onnx_path, w, keep = _weights_source(weights)
        _raise_status(lib.kiln_engine_deserialize_with_weights(data, len(data), onnx_path, w,
                                                               ctypes.byref(h), None))
        del keep
    return Engine(h.value)


# ---- execution contexts -------------------------------------------------------------------------

class ExecutionContext:
    """Per-thread execution state of an engine (its arena is allocated once, here). One thread at
    a time: a second thread that uses it while the first is running it gets KILN-E5011."""

    def __init__(self, engine: Engine, cuda_graphs: bool = True):
        self.engine = engine
        h = ctypes.c_void_p()
        _raise_status(lib.kiln_context_create(engine._h, 1 if cuda_graphs else 0, ctypes.byref(h)))
        self._h = h
        self._slots = {t.name: _Slot(t.name) for t in engine.inputs + engine.outputs}
        self._input_names = [t.name for t in engine.inputs]
        self._input_set = frozenset(self._input_names)
        self._output_names = [t.name for t in engine.outputs]
        self._shape_dims = (ctypes.c_int64 * _lib.KILN_MAX_DIMS)()
        self._shape_ndim = ctypes.c_int32()
        self._output_dtypes = {t.name: t.dtype for t in engine.outputs}
        self._data_dependent = engine.data_dependent_outputs
        # Output shapes of the bound inputs, kept while no input binding changes.
        self._out_shapes: Dict[str, Tuple[int, ...]] = {}
        self._cuda = engine.backend == "cuda"
        # The GPU the context's memory lives on (the current one at creation).
        self._device_index = _torch().cuda.current_device() if self._cuda else None
        # Held through each call that touches the context (run, bind, shape, execute), so that a
        # second thread is refused before it writes the slots the first one is handing to C.
        self._lock = threading.Lock()
        # kiln._fast's runner for this context (None: ctypes alone): run() and ctx(x) go through
        # it first, and take the Python path below whenever it declines the call. Its flag is then
        # the lock of both paths (tried the same way, and cheaper to take from C).
        self._fast = self._fast_runner()
        if self._fast is not None:
            self._lock = self._fast

    def _fast_runner(self):
        if _lib.fast is None or self._data_dependent:
            # Data-dependent outputs are cut to each run's dims on the Python path.
            return None
        try:
            torch = _torch()
        except ImportError:
            return None
        stream_of = None
        if self._cuda:
            stream_of = _current_raw_stream() or (
                lambda index: torch.cuda.current_stream(index).cuda_stream)
        return _lib.fast.Runner(
            self._h.value, _lib.fast_functions(), tuple(self._input_names),
            tuple(self._output_names), tuple(self._output_dtypes[n] for n in self._output_names),
            dict(_dtype_tables()[0]), _raise_status, torch, stream_of,
            self._device_index)

    def _claim(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise _error(5011, "this execution context is in use by another thread (inside its "
                         "run, bind, shape or execute); give each thread its own context "
                         "(engine.create_execution_context())")

    def __del__(self):
        fast = getattr(self, "_fast", None)
        if fast is not None:
            fast.close()
        h = getattr(self, "_h", None)
        if h is not None and h.value:
            lib.kiln_context_free(h)
            self._h = None

    def _slot(self, name: str) -> _Slot:
        slot = self._slots.get(name)
        if slot is None:
            raise _error(5005, f"no engine input or output is called '{name}'; the engine has "
                         f"inputs {self._input_names} and outputs {self._output_names}")
        return slot

    def bind(self, name: str, tensor) -> None:
        """Binds a tensor's memory to an input or output (no copy). Inputs first: an output's
        shape follows from them."""
        self._claim()
        try:
            self._bind(name, tensor)
        finally:
            self._lock.release()

    def _bind(self, name: str, tensor) -> None:
        slot = self._slot(name)
        slot.key = None
        if self._fast is not None:
            self._fast.forget()  # its bindings are no longer the context's
        if name in self._input_set:
            self._out_shapes.clear()
        if self._cuda and tensor.device.type == "cuda" and tensor.device.index != self._device_index:
            raise _error(5012, f"tensor '{name}' is on {tensor.device}; this context was created "
                         f"on cuda:{self._device_index}")
        slot.fill(tensor)
        _raise_status(lib.kiln_context_bind(self._h, slot.name, slot.ref))

    def shape(self, name: str) -> Tuple[int, ...]:
        """An input's bound shape, or an output's once every input is bound. A data-dependent
        output (engine.data_dependent_outputs) has its bound until an execute, then the dims that
        execute reported (its actual shape)."""
        self._claim()
        try:
            return self._shape(name)
        finally:
            self._lock.release()

    def max_shape(self, name: str) -> Tuple[int, ...]:
        """The shape to allocate and bind an output at: shape()'s, with each data-dependent dim at
        its bound for the bound inputs."""
        self._claim()
        try:
            return self._shape(name, lib.kiln_context_max_shape)
        finally:
            self._lock.release()

    def _shape(self, name: str, fn=None) -> Tuple[int, ...]:
        _raise_status((fn or lib.kiln_context_shape)(
            self._h, self._slot(name).name, ctypes.byref(self._shape_ndim), self._shape_dims))
        return tuple(self._shape_dims[:self._shape_ndim.value])

    def _cut(self, name: str, out):
        """A data-dependent output after a run: the view of its leading elements at the dims the
        run reported (the engine writes it densely there)."""
        shape = self._shape(name)
        if tuple(out.shape) == shape:
            return out
        n = 1
        for d in shape:
            n *= d
        return out.reshape(-1)[:n].view(shape)

    def execute(self, stream=None) -> None:
        """Enqueues the engine on `stream` (CUDA engines: torch's current stream of the context's
        GPU when None); no device-wide synchronisation."""
        self._claim()
        try:
            _raise_status(lib.kiln_context_execute(self._h, self._stream_ptr(stream)))
        finally:
            self._lock.release()

    def _stream_ptr(self, stream):
        if not self._cuda:
            return None
        if stream is None:
            # The current stream's handle without building a torch.cuda.Stream object (a few
            # microseconds per call on torch 2.x); torch.cuda.current_stream() where torch lacks it.
            raw = _current_raw_stream()
            if raw is not None:
                return raw(self._device_index)
            stream = _torch().cuda.current_stream(self._device_index)
        return stream if isinstance(stream, int) else stream.cuda_stream

    def run(self, inputs, outputs: Optional[Mapping[str, Any]] = None,
            stream=None) -> Dict[str, Any]:
        """Runs the engine on torch tensors: `inputs` maps names to tensors (or is a sequence in
        the engine's input order); `outputs` optionally maps output names to preallocated
        tensors, which are written in place. Returns every output by name. A data-dependent output
        (engine.data_dependent_outputs: NonZero's count...) is allocated, or must be given, at
        max_shape(); it is returned as a view of its leading elements at the dims this run
        reported (0 rows included)."""
        fast = self._fast
        if fast is not None:
            result = fast.run(inputs, outputs, stream)
            if result is not None:
                return result
        self._claim()
        try:
            return self._run(inputs, outputs, stream)
        finally:
            self._lock.release()

    def _run(self, inputs, outputs, stream) -> Dict[str, Any]:
        if self._fast is not None:
            # The C path may have bound other tensors since this path's keys were set: rebind all.
            self._fast.forget()
            for slot in self._slots.values():
                slot.key = None
            self._out_shapes.clear()
        if isinstance(inputs, Mapping):
            items = list(inputs.items())
        else:
            if isinstance(inputs, _torch().Tensor):
                inputs = (inputs,)
            elif not isinstance(inputs, (list, tuple)):
                inputs = list(inputs)
            if len(inputs) != len(self._input_names):
                raise _error(5000, f"{len(inputs)} inputs given; the engine takes "
                             f"{len(self._input_names)}: {self._input_names}")
            items = zip(self._input_names, inputs)
        given = dict(outputs) if outputs else None
        result: Dict[str, Any] = {}
        try:
            # Tensors bound by the last run with the same memory, shape, strides, dtype and device
            # stay bound (the engine reads the memory at every execute); new input bindings
            # re-check every output and the output shapes are asked again.
            changed = False
            first = None
            for name, t in items:
                if first is None:
                    first = t
                if self._bind_cached(name, t, False):
                    changed = True
            if changed:
                self._out_shapes.clear()
            for name in self._output_names:
                out = given.pop(name, None) if given else None
                if out is None:
                    shape = self._out_shapes.get(name)
                    if shape is None:
                        shape = self._out_shapes[name] = self._shape(
                            name, lib.kiln_context_max_shape)
                    device = first.device if (first is not None and self._cuda) else "cpu"
                    out = _torch().empty(shape, dtype=self._output_dtypes[name], device=device)
                self._bind_cached(name, out, changed)
                result[name] = out
            if given:
                raise _error(5005, f"outputs {sorted(given)} are not engine outputs; the engine "
                             f"has {self._output_names}")
            _raise_status(lib.kiln_context_execute(self._h, self._stream_ptr(stream)))
            for name in self._data_dependent:
                result[name] = self._cut(name, result[name])
        except BaseException:
            for slot in self._slots.values():
                slot.key = None
            self._out_shapes.clear()
            lib.kiln_context_release(self._h)
            raise
        return result

    def _bind_cached(self, name: str, tensor, force: bool) -> bool:
        """Binds unless the same tensor is bound already; True when it bound."""
        slot = self._slot(name)
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
        if not force and slot.key == key:
            return False
        self._bind(name, tensor)
        slot.key = key
        return True

    def __call__(self, *inputs):
        """context(x, ...) -> the output tensor, or a tuple of them."""
        fast = self._fast
        if fast is not None:
            values = fast.call(inputs)
            if values is not None:
                return values
        out = self.run(list(inputs))
        values = [out[n] for n in self._output_names]
        return values[0] if len(values) == 1 else tuple(values)

    @property
    def graph_captures(self) -> int:
        return lib.kiln_context_graph_captures(self._h)

    @property
    def graph_launches(self) -> int:
        return lib.kiln_context_graph_launches(self._h)


# ---- build ----------------------------------------------------------------------------------

def _dims_text(dims: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in dims)


def _options(backend, fp16, bf16, int8, profiles, deadline, memory_budget, max_kernel_time,
             timing_cache, calib_dir, calib_method, calib_percentile, calib_cache,
             int8_tolerance, optimize, fp8=False, calib_on_cpu=False,
             fp8_tolerance=None, fp8_edges=True, int8_edges=True,
             quantized_if_faster=None) -> Sequence[Tuple[str, str]]:
    opts = [("backend", backend), ("fp16", "1" if fp16 else "0"), ("bf16", "1" if bf16 else "0"),
            ("int8", "1" if int8 else "0"), ("optimize", "1" if optimize else "0")]
    if fp8:
        opts.append(("fp8", "1"))
    for name, (lo, opt, hi) in (profiles or {}).items():
        opts.append(("profile", f"{name}:{_dims_text(lo)},{_dims_text(opt)},{_dims_text(hi)}"))
    if deadline is not None:
        opts.append(("deadline", f"{int(deadline * 1000)}ms" if isinstance(deadline, (int, float))
                     else str(deadline)))
    if memory_budget is not None:
        opts.append(("memory_budget", str(memory_budget)))
    if max_kernel_time is not None:
        opts.append(("max_kernel_time", str(float(max_kernel_time))))
    if timing_cache is not None:
        opts.append(("timing_cache", os.fspath(timing_cache)))
    if calib_dir is not None:
        opts.append(("calib_dir", os.fspath(calib_dir)))
    if calib_method is not None:
        opts.append(("calib_method", str(calib_method)))
    if calib_percentile is not None:
        opts.append(("calib_percentile", str(float(calib_percentile))))
    if calib_cache is not None:
        opts.append(("calib_cache", os.fspath(calib_cache)))
    if int8_tolerance is not None:
        opts.append(("int8_tolerance", str(int8_tolerance)))
    if fp8_tolerance is not None:
        opts.append(("fp8_tolerance", str(fp8_tolerance)))
    if calib_on_cpu:
        opts.append(("calib_on_cpu", "1"))
    # Only the non-defaults, like the CLI's --no-fp8-edges / --no-int8-edges.
    if not fp8_edges:
        opts.append(("fp8_edges", "0"))
    if not int8_edges:
        opts.append(("int8_edges", "0"))
    if quantized_if_faster is not None:
        opts.append(("quantized_if_faster", "1" if quantized_if_faster else "0"))
    return opts


class _Config:
    """A kiln_build_config with its options set and the progress callback wired."""

    def __init__(self, options, progress: Optional[Callable[..., Any]]):
        h = ctypes.c_void_p()
        _raise_status(lib.kiln_build_config_create(ctypes.byref(h)))
        self._h = h
        self.error: Optional[BaseException] = None
        for key, value in options:
            _raise_status(lib.kiln_build_config_set(h, key.encode(), str(value).encode()))
        self._fn = None
        if progress is not None:
            def call(_user, phase, done, total, elapsed, detail):
                try:
                    keep = progress(phase.decode(), done, total, elapsed, detail.decode())
                    return 0 if keep is False else 1
                except BaseException as e:  # re-raised after the build; the build stops now
                    self.error = e
                    return 0
            self._fn = _lib.PROGRESS_FN(call)
            lib.kiln_build_config_set_progress(h, self._fn, None)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h is not None and h.value:
            lib.kiln_build_config_free(h)
            self._h = None


def _export(module, example_inputs, exporter: str, input_names, output_names, dynamic_axes,
            opset: Optional[int], profiles) -> Tuple[bytes, Sequence[str]]:
    """torch.nn.Module -> ONNX bytes with the chosen exporter ("torchscript" or "dynamo")."""
    import inspect
    torch = _torch()
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    if input_names is None:
        input_names = [f"input_{i}" for i in range(len(example_inputs))]
    if dynamic_axes is None and profiles:
        # Dimensions whose profile bounds differ are dynamic in the exported graph.
        dynamic_axes = {}
        for name, (lo, _opt, hi) in profiles.items():
            axes = {i: f"{name}_d{i}" for i, (a, b) in enumerate(zip(lo, hi)) if a != b}
            if axes:
                dynamic_axes[name] = axes
    kwargs: Dict[str, Any] = dict(input_names=list(input_names), do_constant_folding=True)
    if dynamic_axes:
        kwargs["dynamic_axes"] = dynamic_axes
    if opset is not None:
        kwargs["opset_version"] = opset
    has_dynamo = "dynamo" in inspect.signature(torch.onnx.export).parameters
    if exporter == "dynamo":
        if not has_dynamo:
            raise _error(1001, f"exporter 'dynamo' needs torch.onnx.export(dynamo=True) (PyTorch "
                         f"2.5 or newer); this is PyTorch {torch.__version__}: use "
                         "exporter='torchscript'")
        kwargs["dynamo"] = True
        kwargs.pop("do_constant_folding")
    elif exporter == "torchscript":
        if has_dynamo:
            kwargs["dynamo"] = False
    else:
        raise _error(1001, f"exporter '{exporter}': use 'torchscript' or 'dynamo'")
    was_training = module.training
    module.eval()
    try:
        f = io.BytesIO()
        with torch.no_grad():
            if output_names is None:
                # output_0, output_1, ... rather than the exporter's node numbers.
                produced = module(*example_inputs)
                count = len(produced) if isinstance(produced, (tuple, list)) else 1
                output_names = [f"output_{i}" for i in range(count)]
            kwargs["output_names"] = list(output_names)
            torch.onnx.export(module, example_inputs, f, **kwargs)
    finally:
        module.train(was_training)
    return f.getvalue(), input_names


def _write_calibration(data, input_names: Sequence[str], directory: str) -> None:
    """Calibration tensors (a sequence or a DataLoader of batches: a tensor, a tuple of tensors in
    input order, or a dict by input name) -> the ONNX test-data layout the builder reads."""
    from onnx import numpy_helper
    torch = _torch()
    for n, batch in enumerate(data):
        if isinstance(batch, torch.Tensor):
            batch = (batch,)
        if isinstance(batch, Mapping):
            batch = tuple(batch[name] for name in input_names)
        case = os.path.join(directory, f"test_data_set_{n}")
        os.makedirs(case)
        for i, t in enumerate(batch):
            if i >= len(input_names):
                break
            proto = numpy_helper.from_array(t.detach().cpu().contiguous().numpy(), input_names[i])
            with open(os.path.join(case, f"input_{i}.pb"), "wb") as f:
                f.write(proto.SerializeToString())


def build(model, example_inputs=None, *, backend: str = "auto", fp16: bool = False,
          bf16: bool = False, int8: bool = False, fp8: bool = False,
          profiles: Optional[Mapping[str, Tuple[Sequence[int], Sequence[int], Sequence[int]]]] = None,
          deadline: Union[None, float, str] = None, memory_budget: Union[None, int, float, str] = None,
          max_kernel_time: Optional[float] = None, timing_cache=None, calibration=None,
          calib_method: Optional[str] = None, calib_percentile: Optional[float] = None,
          calib_cache=None, int8_tolerance=None, calib_on_cpu: bool = False,
          fp8_tolerance=None, fp8_edges: bool = True, int8_edges: bool = True,
          quantized_if_faster: Optional[bool] = None, optimize: bool = True,
          progress: Optional[Callable[..., Any]] = None,
          exporter: str = "torchscript", input_names: Optional[Sequence[str]] = None,
          output_names: Optional[Sequence[str]] = None, dynamic_axes=None,
          opset: Optional[int] = None, distributed=None, **distributed_options) -> Engine:
    """Builds an engine from an ONNX path, ONNX bytes, or a torch.nn.Module with example inputs.

    Every `kiln build` option is a keyword: backend ("auto", "cpu", "cuda"), fp16/bf16/int8/fp8,
    profiles ({input: (min, opt, max)}), deadline (seconds or "5m"), memory_budget (bytes, a
    fraction of free memory, or "8G"), max_kernel_time (ms), timing_cache (path), calibration
    (tensors or a DataLoader; or a directory in the ONNX test-data layout), calib_method,
    calib_percentile, calib_cache, int8_tolerance, fp8_tolerance, calib_on_cpu (calibrate on the CPU reference
    even for a GPU build; by default calibration runs on the build's device), fp8_edges and
    int8_edges (False keeps float values between two quantized products, like the CLI's
    --no-fp8-edges / --no-int8-edges), quantized_if_faster (True: a quantized layer runs float where
    a float tactic is faster; False: it stays quantized; None: the backend's default, like
    --quantized-if-faster auto), optimize.
    `progress(phase, done, total,
    elapsed_s, detail)` is called as the build goes; returning False cancels it. `distributed=True` (or a
    torch.distributed process group) builds once for the whole job: see kiln.distributed.build.
    """
    torch_module = False
    try:
        import torch
        torch_module = isinstance(model, torch.nn.Module)
    except ImportError:
        pass
    name = "model"
    path = None
    if torch_module:
        data, names = _export(model, example_inputs, exporter, input_names, output_names,
                              dynamic_axes, opset, profiles)
        name = type(model).__name__
    elif isinstance(model, (bytes, bytearray, memoryview)):
        data, names = bytes(model), None
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        data, names = None, None
        name = os.path.basename(path)
    else:
        raise _error(1001, f"model is a {type(model).__name__}: give an ONNX path, ONNX bytes or a "
                     "torch.nn.Module with example_inputs")
    with tempfile.TemporaryDirectory(prefix="kiln-calib-") as tmp:
        calib_dir = None
        if calibration is not None:
            if isinstance(calibration, (str, os.PathLike)):
                calib_dir = os.fspath(calibration)
            else:
                if names is None:
                    names = _onnx_input_names(data if path is None else path)
                _write_calibration(calibration, names, tmp)
                calib_dir = tmp
        options = _options(backend, fp16, bf16, int8, profiles, deadline, memory_budget,
                           max_kernel_time, timing_cache, calib_dir, calib_method,
                           calib_percentile, calib_cache, int8_tolerance, optimize, fp8=fp8,
                           calib_on_cpu=calib_on_cpu, fp8_tolerance=fp8_tolerance,
                           fp8_edges=fp8_edges, int8_edges=int8_edges,
                           quantized_if_faster=quantized_if_faster)
        config = _Config(options, progress)
        if distributed:
            from . import distributed as dist
            if data is None:
                with open(path, "rb") as f:
                    data = f.read()
            group = None if distributed is True else distributed
            return dist._build_once(config, data, name, group, **distributed_options)
        if distributed_options:
            raise _error(1001, f"options {sorted(distributed_options)} are for distributed=True")
        h = ctypes.c_void_p()
        if path is not None:
            status = lib.kiln_build_from_file(config._h, path.encode(), ctypes.byref(h))
        else:
            status = lib.kiln_build_from_bytes(config._h, data, len(data), name.encode(),
                                               ctypes.byref(h))
        if config.error is not None:
            if h.value:
                lib.kiln_engine_free(h)
            if status:
                lib.kiln_status_free(status)
            raise config.error
        _raise_status(status)
        return Engine(h.value)


def _onnx_input_names(model) -> Sequence[str]:
    import onnx
    proto = onnx.load_model_from_string(model) if isinstance(model, bytes) else onnx.load(model)
    initializers = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in initializers]


from . import distributed  # noqa: E402  (kiln.distributed.build)
