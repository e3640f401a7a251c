"""Loads libkiln_c.so (the C API, src/kiln/api/kiln_c.h) and declares its functions for ctypes.

One binary serves every Python version: this module only describes the C signatures.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

KILN_MAX_DIMS = 16

# enum kiln_dtype / kiln_device_type (kiln_c.h)
DTYPE_FLOAT32, DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_INT8 = 1, 2, 3, 4
DTYPE_UINT8, DTYPE_INT32, DTYPE_INT64, DTYPE_BOOL = 5, 6, 7, 8
DTYPE_FLOAT64, DTYPE_INT16, DTYPE_UINT16, DTYPE_UINT32, DTYPE_UINT64 = 9, 10, 11, 12, 13
DEVICE_CPU, DEVICE_CUDA = 1, 2


class Tensor(ctypes.Structure):
    """struct kiln_tensor: borrowed memory described like DLPack."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
    ]


class NamedTensor(ctypes.Structure):
    """struct kiln_named_tensor: one refit weight by initializer name."""

    _fields_ = [("name", ctypes.c_char_p), ("tensor", Tensor)]


PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                               ctypes.c_int64, ctypes.c_double, ctypes.c_char_p)
# struct kiln_comm (kiln_c.h): a process group the caller owns, as three callbacks.
ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.c_double)
BROADCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int, ctypes.c_double)


class Comm(ctypes.Structure):
    pass


# int split(void* user, int color, int key, kiln_comm* out, double timeout_s)
SPLIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(Comm), ctypes.c_double)
Comm._fields_ = [
    ("user", ctypes.c_void_p),
    ("rank", ctypes.c_int),
    ("size", ctypes.c_int),
    ("allgather", ALLGATHER_FN),
    ("broadcast", BROADCAST_FN),
    ("split", SPLIT_FN),
]


class BuildOnceOptions(ctypes.Structure):
    """struct kiln_build_once_options (zero: the default)."""

    _fields_ = [
        ("join_timeout_s", ctypes.c_double),
        ("wait_timeout_s", ctypes.c_double),
        ("transfer_timeout_s", ctypes.c_double),
        ("heartbeat_timeout_s", ctypes.c_double),
        ("build_on", ctypes.c_char_p),
        ("cache_dir", ctypes.c_char_p),
        ("trust_shared_cache", ctypes.c_int),
    ]


class RefitWeights(ctypes.Structure):
    """struct kiln_refit_weights: one rank's new weights (ONNX bytes or named tensors)."""

    _fields_ = [
        ("onnx", ctypes.c_char_p),
        ("onnx_size", ctypes.c_size_t),
        ("tensors", ctypes.POINTER(NamedTensor)),
        ("count", ctypes.c_size_t),
    ]


# The kiln_c.h this module describes (KILN_C_API_VERSION).
API_VERSION = 5


def _candidates():
    env = os.environ.get("KILN_LIBRARY")
    if env:
        yield Path(env)
        return
    here = Path(__file__).resolve().parent
    yield here / "libkiln_c.so"  # installed by `pip install .`
    root = here.parent.parent  # python/kiln -> the checkout
    for build in ("build", "build-cuda"):
        yield root / build / "src" / "kiln" / "api" / "libkiln_c.so"
    yield root / ".bundle" / "lib" / "libkiln_c.so"


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path))
    raise ImportError(
        "kiln: libkiln_c.so not found (looked at " + ", ".join(tried) + "); build it with "
        "`cmake --build build --target kiln_c`, install the package with `pip install .`, or "
        "point KILN_LIBRARY at the library")


lib = _load()

_P = ctypes.c_void_p
_S = ctypes.c_void_p  # kiln_status*
_I64P = ctypes.POINTER(ctypes.c_int64)


def _decl(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


_decl("kiln_status_code", ctypes.c_int, _S)
for _n in ("id", "name", "message", "remedy"):
    _decl("kiln_status_" + _n, ctypes.c_char_p, _S)
_decl("kiln_status_free", None, _S)
_decl("kiln_status_make", _S, ctypes.c_int, ctypes.c_char_p)
_decl("kiln_buffer_data", _P, _P)
_decl("kiln_buffer_size", ctypes.c_size_t, _P)
_decl("kiln_buffer_free", None, _P)
_decl("kiln_api_version", ctypes.c_int)
_decl("kiln_version", ctypes.c_char_p)
_decl("kiln_build_config_create", _S, ctypes.POINTER(_P))
_decl("kiln_build_config_free", None, _P)
_decl("kiln_build_config_set", _S, _P, ctypes.c_char_p, ctypes.c_char_p)
_decl("kiln_build_config_set_progress", None, _P, PROGRESS_FN, _P)
_decl("kiln_build_from_file", _S, _P, ctypes.c_char_p, ctypes.POINTER(_P))
_decl("kiln_build_from_bytes", _S, _P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
      ctypes.POINTER(_P))
_decl("kiln_engine_load", _S, ctypes.c_char_p, ctypes.POINTER(_P))
_decl("kiln_engine_deserialize", _S, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_P))
_decl("kiln_engine_free", None, _P)
_decl("kiln_engine_serialize", _S, _P, ctypes.POINTER(_P))
_decl("kiln_engine_save", _S, _P, ctypes.c_char_p)
_decl("kiln_engine_report_json", _S, _P, ctypes.POINTER(_P))
_decl("kiln_engine_backend", ctypes.c_char_p, _P)
_decl("kiln_engine_arch", ctypes.c_char_p, _P)
_decl("kiln_engine_num_bindings", ctypes.c_int, _P)
_decl("kiln_engine_binding", _S, _P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
      ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int32),
      ctypes.POINTER(ctypes.c_int32), _I64P)
_decl("kiln_engine_profile", _S, _P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int),
      ctypes.POINTER(ctypes.c_int32), _I64P, _I64P, _I64P)
_decl("kiln_engine_refit_from_file", _S, _P, ctypes.c_char_p, ctypes.POINTER(_P))
_decl("kiln_engine_refit_from_bytes", _S, _P, ctypes.c_char_p, ctypes.c_size_t,
      ctypes.POINTER(_P))
_decl("kiln_engine_refit", _S, _P, ctypes.POINTER(NamedTensor), ctypes.c_size_t,
      ctypes.POINTER(_P))
_decl("kiln_engine_weights_generation", ctypes.c_uint64, _P)
_decl("kiln_engine_refit_group", _S, _P, ctypes.POINTER(RefitWeights), ctypes.POINTER(Comm),
      ctypes.c_double, ctypes.POINTER(_P))
_decl("kiln_engine_serialize_stripped", _S, _P, ctypes.POINTER(_P))
_decl("kiln_engine_save_stripped", _S, _P, ctypes.c_char_p)
_decl("kiln_engine_load_with_weights", _S, ctypes.c_char_p, ctypes.c_char_p,
      ctypes.POINTER(RefitWeights), ctypes.POINTER(_P), ctypes.POINTER(_P))
_decl("kiln_engine_deserialize_with_weights", _S, ctypes.c_char_p, ctypes.c_size_t,
      ctypes.c_char_p, ctypes.POINTER(RefitWeights), ctypes.POINTER(_P), ctypes.POINTER(_P))
_decl("kiln_context_create", _S, _P, ctypes.c_int, ctypes.POINTER(_P))
_decl("kiln_context_free", None, _P)
_decl("kiln_context_bind", _S, _P, ctypes.c_char_p, ctypes.POINTER(Tensor))
_decl("kiln_context_shape", _S, _P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), _I64P)
_decl("kiln_context_max_shape", _S, _P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), _I64P)
_decl("kiln_engine_binding_data_dependent", _S, _P, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32))
_decl("kiln_context_execute", _S, _P, _P)
_decl("kiln_context_release", None, _P)
_decl("kiln_context_graph_captures", ctypes.c_int64, _P)
_decl("kiln_context_graph_launches", ctypes.c_int64, _P)
_decl("kiln_build_once", _S, _P, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
      ctypes.POINTER(Comm), ctypes.POINTER(BuildOnceOptions), ctypes.POINTER(_P),
      ctypes.POINTER(_P))

if lib.kiln_api_version() != API_VERSION:
    raise ImportError(
        f"kiln: {lib._name} has C API version {lib.kiln_api_version()}, this package needs "
        f"{API_VERSION}: rebuild libkiln_c.so from the same checkout (or reinstall the package)")


def take_buffer(buf: int) -> bytes:
    """Copies a kiln_buffer into Python bytes and frees it."""
    try:
        size = lib.kiln_buffer_size(buf)
        data = lib.kiln_buffer_data(buf)
        return ctypes.string_at(data, size) if size else b""
    finally:
        lib.kiln_buffer_free(buf)


# ---- kiln._fast: the C hot path of ExecutionContext.run (python/kiln/_fast.c) -----------------

def _load_fast():
    """The kiln._fast extension and where it came from, or None and why not.

    Looked for next to this package (`pip install .` puts it there), then beside the libkiln_c.so
    just loaded (KILN_LIBRARY's folder, the build folder, the bundle's lib/). KILN_PYTHON_FAST=0
    keeps to ctypes alone. A module for another C API version is left aside."""
    if os.environ.get("KILN_PYTHON_FAST", "1") == "0":
        return None, "off (KILN_PYTHON_FAST=0)"
    here = Path(__file__).resolve().parent
    seen = []
    for folder in (here, Path(lib._name).parent):
        for path in sorted(folder.glob("_fast*.so")):
            seen.append(str(path))
            try:
                spec = importlib.util.spec_from_file_location(__package__ + "._fast", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            except ImportError as e:  # built for another platform or Python ABI
                seen[-1] += f" ({e})"
                continue
            if module.C_API_VERSION != API_VERSION:
                seen[-1] += f" (C API version {module.C_API_VERSION}, not {API_VERSION})"
                continue
            return module, str(path)
    return None, "not found" + (": " + ", ".join(seen) if seen else "")


def fast_functions():
    """The addresses kiln._fast calls: kiln_context_bind, _max_shape (the dims it allocates an
    output at), _execute and _release."""
    return tuple(ctypes.cast(getattr(lib, "kiln_context_" + n), ctypes.c_void_p).value
                 for n in ("bind", "max_shape", "execute", "release"))


# fast: the module or None (ctypes alone); fast_origin: its path, or why it is not used.
fast, fast_origin = _load_fast()
