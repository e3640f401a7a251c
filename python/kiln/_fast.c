/* kiln._fast: the hot path of ExecutionContext.run / ctx(x) in C (issue 24), so that a run of
 * tensors already bound costs a few attribute reads and one direct call of kiln_context_execute
 * instead of a ctypes call and a page of Python. Stable ABI only (abi3): one .so serves CPython
 * 3.9+. It does not link libkiln_c.so: the package hands it the C functions' addresses it already
 * holds through ctypes.
 *
 * The module only ever takes the plain case. Anything unusual (an input that is not a list, tuple,
 * dict or tensor; a dtype, layout, rank or device the binding checks would refuse; outputs that
 * are not engine outputs; a context busy in another thread) makes run() return None before it
 * executes, having dropped what it bound, and the Python path (kiln/__init__.py) takes the call
 * from the start and raises its own errors: both paths raise the same KilnErrors. Errors of the
 * C API itself (a bind, shape or execute status) are raised here through the package's own
 * _raise_status. */
#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x03090000
#endif
#include <Python.h>
#include <string.h>

#include "kiln/api/kiln_c.h"

typedef kiln_status* (*BindFn)(kiln_context*, const char*, const kiln_tensor*);
typedef kiln_status* (*ShapeFn)(kiln_context*, const char*, int32_t*, int64_t*);
typedef kiln_status* (*ExecuteFn)(kiln_context*, void*);
typedef void (*ReleaseFn)(kiln_context*);

/* One binding as this module last bound it: the kiln_tensor handed to C and the tensor's key
 * (data pointer, dims and strides live in the struct; dtype and device are kept as objects). */
typedef struct {
  kiln_tensor t;
  int64_t dims[KILN_MAX_DIMS];
  int64_t strides[KILN_MAX_DIMS];
  PyObject* name; /* bytes */
  PyObject* dtype;
  PyObject* device;
  int bound; /* 1: the context holds the tensor the key describes, bound by this module */
} Binding;

typedef struct {
  PyObject_HEAD kiln_context* ctx;
  BindFn bind;
  ShapeFn shape;
  ExecuteFn execute;
  ReleaseFn release;
  Py_ssize_t n_in, n_out;
  Binding* b;             /* n_in inputs, then n_out outputs */
  PyObject** out_shapes;  /* n_out shape tuples of the bound inputs, NULL when unknown */
  PyObject* in_index;     /* {input name: index} */
  PyObject* out_names;    /* tuple of str */
  PyObject* out_dtypes;   /* tuple of torch.dtype */
  PyObject* dtype_codes;  /* {torch.dtype: enum kiln_dtype} */
  PyObject* raise_status; /* kiln._raise_status */
  PyObject* empty;        /* torch.empty */
  PyObject* tensor_type;  /* torch.Tensor */
  PyObject* strided;      /* torch.strided */
  PyObject* stream_of;    /* CUDA engines: device index -> current stream handle; else None */
  PyObject* device_index; /* CUDA engines: the context's GPU; else None */
  long long runs;         /* runs completed here */
  int busy;               /* the context's lock (acquire/release below), held by a call in it */
} Runner;

static PyObject *s_data_ptr, *s_shape, *s_stride, *s_dtype, *s_device, *s_layout, *s_type, *s_index,
    *s_cpu, *s_cuda, *s_cuda_stream;

/* Result of the steps below: done, hand the call to Python (nothing raised), or raised. */
enum { kDone = 1, kBail = 0, kRaised = -1 };

/* Engines with more inputs or outputs than this take the Python path (the run keeps its tensors
 * on the stack). */
enum { kMaxBindings = 256 };

static void ClearOutShapes(Runner* r) {
  for (Py_ssize_t j = 0; r->out_shapes && j < r->n_out; ++j) Py_CLEAR(r->out_shapes[j]);
}

static void Forget(Runner* r) {
  for (Py_ssize_t i = 0; i < r->n_in + r->n_out; ++i) {
    r->b[i].bound = 0;
    Py_CLEAR(r->b[i].dtype);
    Py_CLEAR(r->b[i].device);
  }
  ClearOutShapes(r);
}

/* Reads a tuple of ints (torch.Size, stride()) into out; -1 when it is not one or too long. */
static int ReadDims(PyObject* tuple, int64_t* out, Py_ssize_t* n) {
  if (!PyTuple_Check(tuple)) return -1;
  Py_ssize_t size = PyTuple_Size(tuple);
  if (size < 0 || size > KILN_MAX_DIMS) return -1;
  for (Py_ssize_t i = 0; i < size; ++i) {
    long long v = PyLong_AsLongLong(PyTuple_GetItem(tuple, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    out[i] = v;
  }
  *n = size;
  return 0;
}

/* Fills the kiln_tensor of binding i from t's dtype, layout and device, as _Slot.fill does; kBail
 * where Python's checks would refuse the tensor (they then raise the catalog error). */
static int Fill(Runner* r, Binding* b, PyObject* t, PyObject* dtype, PyObject* device) {
  PyObject* code = PyDict_GetItemWithError(r->dtype_codes, dtype);
  if (!code) return kBail;
  PyObject* layout = PyObject_GetAttr(t, s_layout);
  if (!layout) return kBail;
  int strided = layout == r->strided;
  Py_DECREF(layout);
  if (!strided) return kBail;
  PyObject* type = PyObject_GetAttr(device, s_type);
  if (!type) return kBail;
  int is_cpu = PyUnicode_Compare(type, s_cpu) == 0;
  int is_cuda = !is_cpu && PyUnicode_Compare(type, s_cuda) == 0;
  Py_DECREF(type);
  if (PyErr_Occurred()) return kBail;
  PyObject* index = PyObject_GetAttr(device, s_index);
  if (!index) return kBail;
  long device_id = index == Py_None ? 0 : PyLong_AsLong(index);
  if (r->device_index != Py_None && is_cuda &&
      PyObject_RichCompareBool(index, r->device_index, Py_EQ) != 1) {
    Py_DECREF(index);
    return kBail; /* another GPU than the context's: KILN-E5012 from Python */
  }
  Py_DECREF(index);
  if (PyErr_Occurred()) return kBail;
  b->t.dtype = (int32_t)PyLong_AsLong(code);
  b->t.device_type = is_cpu ? KILN_DEVICE_CPU : is_cuda ? KILN_DEVICE_CUDA : 0;
  b->t.device_id = (int32_t)device_id;
  return kDone;
}

/* Binds t to binding i unless it is bound already with the same key (or force): *bound_now tells
 * which. *status gets a failed bind's status. */
static int BindCached(Runner* r, Py_ssize_t i, PyObject* t, int force, int* bound_now,
                      kiln_status** status) {
  Binding* b = &r->b[i];
  int rc = kBail;
  PyObject *ptr = NULL, *shape = NULL, *stride = NULL, *dtype = NULL, *device = NULL;
  int64_t dims[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
  Py_ssize_t ndim = 0, nstride = 0;
  void* data = NULL;
  *bound_now = 0;
  if (PyObject_IsInstance(t, r->tensor_type) != 1) goto out;
  ptr = PyObject_CallMethodObjArgs(t, s_data_ptr, NULL);
  if (!ptr) goto out;
  data = PyLong_AsVoidPtr(ptr);
  if (PyErr_Occurred()) goto out;
  shape = PyObject_GetAttr(t, s_shape);
  if (!shape || ReadDims(shape, dims, &ndim) < 0) goto out;
  stride = PyObject_CallMethodObjArgs(t, s_stride, NULL);
  if (!stride || ReadDims(stride, strides, &nstride) < 0 || nstride != ndim) goto out;
  dtype = PyObject_GetAttr(t, s_dtype);
  if (!dtype) goto out;
  device = PyObject_GetAttr(t, s_device);
  if (!device) goto out;
  if (!force && b->bound && b->t.data == data && b->t.ndim == ndim &&
      memcmp(b->dims, dims, sizeof(int64_t) * ndim) == 0 &&
      memcmp(b->strides, strides, sizeof(int64_t) * ndim) == 0 && b->dtype == dtype) {
    int same = PyObject_RichCompareBool(b->device, device, Py_EQ);
    if (same < 0) goto out;
    if (same) {
      rc = kDone;
      goto out;
    }
  }
  /* Rebinding: what the context held is no longer what the key says. */
  b->bound = 0;
  if (i < r->n_in) ClearOutShapes(r);
  rc = Fill(r, b, t, dtype, device);
  if (rc != kDone) goto out;
  b->t.data = data;
  b->t.ndim = (int32_t)ndim;
  memcpy(b->dims, dims, sizeof(int64_t) * ndim);
  memcpy(b->strides, strides, sizeof(int64_t) * ndim);
  *status = r->bind(r->ctx, PyBytes_AsString(b->name), &b->t);
  if (*status) {
    rc = kRaised;
    goto out;
  }
  b->bound = 1;
  Py_XDECREF(b->dtype);
  Py_INCREF(dtype);
  b->dtype = dtype;
  Py_XDECREF(b->device);
  Py_INCREF(device);
  b->device = device;
  *bound_now = 1;
out:
  if (rc == kBail) PyErr_Clear(); /* Python's path meets the same problem and says it */
  Py_XDECREF(ptr);
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  Py_XDECREF(dtype);
  Py_XDECREF(device);
  return rc;
}

/* The shape of output j once the inputs are bound (kept until an input is rebound). */
static PyObject* OutShape(Runner* r, Py_ssize_t j, kiln_status** status) {
  if (r->out_shapes[j]) {
    Py_INCREF(r->out_shapes[j]);
    return r->out_shapes[j];
  }
  int32_t ndim = 0;
  int64_t dims[KILN_MAX_DIMS];
  *status = r->shape(r->ctx, PyBytes_AsString(r->b[r->n_in + j].name), &ndim, dims);
  if (*status) return NULL;
  PyObject* shape = PyTuple_New(ndim);
  if (!shape) return NULL;
  for (int32_t k = 0; k < ndim; ++k) {
    PyObject* d = PyLong_FromLongLong(dims[k]);
    if (!d) {
      Py_DECREF(shape);
      return NULL;
    }
    PyTuple_SetItem(shape, k, d);
  }
  Py_INCREF(shape);
  r->out_shapes[j] = shape;
  return shape;
}

static void* StreamPtr(Runner* r, PyObject* stream, int* failed) {
  *failed = 0;
  if (r->stream_of == Py_None) return NULL;
  PyObject* handle;
  if (stream == Py_None) {
    handle = PyObject_CallFunctionObjArgs(r->stream_of, r->device_index, NULL);
  } else if (PyLong_Check(stream)) {
    Py_INCREF(stream);
    handle = stream;
  } else {
    handle = PyObject_GetAttr(stream, s_cuda_stream);
  }
  if (!handle) {
    *failed = 1;
    return NULL;
  }
  void* p = PyLong_AsVoidPtr(handle);
  Py_DECREF(handle);
  if (PyErr_Occurred()) *failed = 1;
  return p;
}

/* The inputs as (binding index, tensor) pairs in the order Python binds them; kBail for a form
 * Python must handle (or refuse). New references in tensors[0..*count). */
static int GatherInputs(Runner* r, PyObject* inputs, Py_ssize_t* index, PyObject** tensors,
                        Py_ssize_t* count) {
  *count = 0;
  if (PyDict_Check(inputs)) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    if (PyDict_Size(inputs) > r->n_in) return kBail;
    while (PyDict_Next(inputs, &pos, &key, &value)) {
      PyObject* i = PyDict_GetItemWithError(r->in_index, key);
      if (!i) {
        PyErr_Clear();
        return kBail; /* an unknown name: KILN-E5005 from Python */
      }
      index[*count] = PyLong_AsSsize_t(i);
      Py_INCREF(value);
      tensors[(*count)++] = value;
    }
    return kDone;
  }
  int is_list = PyList_Check(inputs), is_tuple = !is_list && PyTuple_Check(inputs);
  if (!is_list && !is_tuple) {
    if (r->n_in != 1 || PyObject_IsInstance(inputs, r->tensor_type) != 1) {
      PyErr_Clear();
      return kBail;
    }
    index[0] = 0;
    Py_INCREF(inputs);
    tensors[(*count)++] = inputs;
    return kDone;
  }
  Py_ssize_t n = is_list ? PyList_Size(inputs) : PyTuple_Size(inputs);
  if (n != r->n_in) return kBail; /* KILN-E5000 from Python */
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = is_list ? PyList_GetItem(inputs, i) : PyTuple_GetItem(inputs, i);
    index[i] = i;
    Py_INCREF(t);
    tensors[(*count)++] = t;
  }
  return kDone;
}

/* The given output tensors by output index (new references, NULL where not given: the caller
 * drops them with DropAll); kBail when the mapping is not a dict or names something that is not
 * an output. */
static int GatherOutputs(Runner* r, PyObject* outputs, PyObject** given) {
  for (Py_ssize_t j = 0; j < r->n_out; ++j) given[j] = NULL;
  if (outputs == Py_None) return kDone;
  if (!PyDict_Check(outputs)) return kBail;
  Py_ssize_t found = 0;
  for (Py_ssize_t j = 0; j < r->n_out; ++j) {
    given[j] = PyDict_GetItemWithError(outputs, PyTuple_GetItem(r->out_names, j));
    if (given[j]) {
      Py_INCREF(given[j]);
      ++found;
    }
  }
  if (PyErr_Occurred() || found != PyDict_Size(outputs)) {
    PyErr_Clear();
    return kBail; /* KILN-E5005 from Python */
  }
  return kDone;
}

static void DropAll(PyObject** objects, Py_ssize_t n) {
  for (Py_ssize_t k = 0; k < n; ++k) Py_CLEAR(objects[k]);
}

/* Allocates output j as Python does: torch.empty(shape, dtype, device of the first input on CUDA,
 * else the CPU). */
static PyObject* NewOutput(Runner* r, Py_ssize_t j, PyObject* first, kiln_status** status) {
  PyObject* shape = OutShape(r, j, status);
  if (!shape) return NULL;
  PyObject* device = NULL;
  if (first && r->stream_of != Py_None) {
    device = PyObject_GetAttr(first, s_device);
  } else {
    Py_INCREF(s_cpu);
    device = s_cpu;
  }
  PyObject* args = device ? PyTuple_Pack(1, shape) : NULL;
  PyObject* kwargs = args ? PyDict_New() : NULL;
  PyObject* out = NULL;
  if (kwargs && PyDict_SetItem(kwargs, s_dtype, PyTuple_GetItem(r->out_dtypes, j)) == 0 &&
      PyDict_SetItem(kwargs, s_device, device) == 0) {
    out = PyObject_Call(r->empty, args, kwargs);
  }
  Py_XDECREF(kwargs);
  Py_XDECREF(args);
  Py_XDECREF(device);
  Py_DECREF(shape);
  return out;
}

/* The run, as ExecutionContext._run does it: *result gets {output name: tensor}. */
static int Run(Runner* r, PyObject* inputs, PyObject* outputs, PyObject* stream,
               PyObject** result) {
  *result = NULL;
  if (!r->ctx || r->busy) return kBail; /* busy: in use by another thread, KILN-E5011 */
  r->busy = 1;

  int rc = kDone, changed = 0, bound_now = 0, stream_failed = 0;
  kiln_status* status = NULL;
  Py_ssize_t count = 0, n_given = 0;
  Py_ssize_t index[kMaxBindings];
  PyObject* tensors[kMaxBindings];
  PyObject* given[kMaxBindings];
  PyObject* dict = NULL;
  void* s = NULL;
  if (r->n_in > kMaxBindings || r->n_out > kMaxBindings) {
    rc = kBail;
    goto fail;
  }
  rc = GatherInputs(r, inputs, index, tensors, &count);
  if (rc != kDone) goto fail;
  rc = GatherOutputs(r, outputs, given);
  n_given = r->n_out;
  if (rc != kDone) goto fail;
  for (Py_ssize_t k = 0; k < count; ++k) {
    rc = BindCached(r, index[k], tensors[k], 0, &bound_now, &status);
    if (rc != kDone) goto fail;
    changed |= bound_now;
  }
  if (changed) ClearOutShapes(r);
  dict = PyDict_New();
  if (!dict) goto raised;
  for (Py_ssize_t j = 0; j < r->n_out; ++j) {
    PyObject* out = given[j];
    if (out) {
      Py_INCREF(out);
    } else {
      out = NewOutput(r, j, count ? tensors[0] : NULL, &status);
      if (!out) goto raised;
    }
    rc = BindCached(r, r->n_in + j, out, changed, &bound_now, &status);
    if (rc == kDone && PyDict_SetItem(dict, PyTuple_GetItem(r->out_names, j), out) < 0) {
      rc = kRaised;
    }
    Py_DECREF(out);
    if (rc != kDone) goto fail;
  }
  s = StreamPtr(r, stream, &stream_failed);
  if (stream_failed) goto raised;
  /* The GIL is let go while the engine runs (or enqueues), as ctypes does. */
  PyThreadState* thread = PyEval_SaveThread();
  status = r->execute(r->ctx, s);
  PyEval_RestoreThread(thread);
  if (status) goto raised;
  DropAll(tensors, count);
  DropAll(given, n_given);
  r->busy = 0;
  ++r->runs;
  *result = dict;
  return kDone;

raised:
  rc = kRaised;
fail:
  /* As Python's path: every binding is rechecked next time and the context is released. */
  Forget(r);
  r->release(r->ctx);
  DropAll(tensors, count);
  DropAll(given, n_given);
  Py_XDECREF(dict);
  if (rc == kBail) PyErr_Clear();
  r->busy = 0;
  if (status) {
    PyObject* handle = PyLong_FromVoidPtr(status);
    PyObject* none = handle ? PyObject_CallFunctionObjArgs(r->raise_status, handle, NULL) : NULL;
    Py_XDECREF(handle);
    Py_XDECREF(none); /* _raise_status raises (and frees the status) */
    return kRaised;
  }
  return rc;
}

static PyObject* Runner_run(Runner* r, PyObject* args) {
  PyObject *inputs, *outputs = Py_None, *stream = Py_None, *result;
  if (!PyArg_ParseTuple(args, "O|OO:run", &inputs, &outputs, &stream)) return NULL;
  int rc = Run(r, inputs, outputs, stream, &result);
  if (rc == kRaised) return NULL;
  if (rc == kBail) Py_RETURN_NONE;
  return result;
}

/* ctx(x, ...): the output tensor, or a tuple of them; None: the Python path takes the call. */
static PyObject* Runner_call(Runner* r, PyObject* inputs) {
  PyObject* result;
  int rc = Run(r, inputs, Py_None, Py_None, &result);
  if (rc == kRaised) return NULL;
  if (rc == kBail) Py_RETURN_NONE;
  PyObject* values = NULL;
  if (r->n_out == 1) {
    values = PyDict_GetItemWithError(result, PyTuple_GetItem(r->out_names, 0));
    Py_XINCREF(values);
  } else {
    values = PyTuple_New(r->n_out);
    for (Py_ssize_t j = 0; values && j < r->n_out; ++j) {
      PyObject* v = PyDict_GetItemWithError(result, PyTuple_GetItem(r->out_names, j));
      Py_XINCREF(v);
      PyTuple_SetItem(values, j, v);
    }
  }
  Py_DECREF(result);
  return values;
}

/* The context's lock, for the Python path too: a flag read and set under the GIL (the module needs
 * the GIL, so it never runs free-threaded). It is only ever tried: a context in use is refused
 * (KILN-E5011), never waited for. */
static PyObject* Runner_acquire(Runner* r, PyObject* args, PyObject* kwargs) {
  static char* kw[] = {"blocking", NULL};
  int blocking = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:acquire", kw, &blocking)) return NULL;
  if (!r->busy) {
    r->busy = 1;
    Py_RETURN_TRUE;
  }
  if (blocking) {
    PyErr_SetString(PyExc_RuntimeError, "kiln context lock: only acquire(blocking=False)");
    return NULL;
  }
  Py_RETURN_FALSE;
}

static PyObject* Runner_release(Runner* r, PyObject* unused) {
  if (!r->busy) {
    PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
    return NULL;
  }
  r->busy = 0;
  Py_RETURN_NONE;
}

static PyObject* Runner_forget(Runner* r, PyObject* unused) {
  Forget(r);
  Py_RETURN_NONE;
}

static PyObject* Runner_close(Runner* r, PyObject* unused) {
  Forget(r);
  r->ctx = NULL;
  Py_RETURN_NONE;
}

static PyObject* Runner_get_runs(Runner* r, void* unused) { return PyLong_FromLongLong(r->runs); }

static void Runner_dealloc(Runner* r) {
  PyTypeObject* type = Py_TYPE(r);
  if (r->b) {
    Forget(r);
    for (Py_ssize_t i = 0; i < r->n_in + r->n_out; ++i) Py_XDECREF(r->b[i].name);
    PyMem_Free(r->b);
  }
  PyMem_Free(r->out_shapes);
  Py_XDECREF(r->in_index);
  Py_XDECREF(r->out_names);
  Py_XDECREF(r->out_dtypes);
  Py_XDECREF(r->dtype_codes);
  Py_XDECREF(r->raise_status);
  Py_XDECREF(r->empty);
  Py_XDECREF(r->tensor_type);
  Py_XDECREF(r->strided);
  Py_XDECREF(r->stream_of);
  Py_XDECREF(r->device_index);
  freefunc free_fn = (freefunc)PyType_GetSlot(type, Py_tp_free);
  free_fn(r);
  Py_DECREF(type);
}

static void* Address(PyObject* tuple, Py_ssize_t i) {
  return PyLong_AsVoidPtr(PyTuple_GetItem(tuple, i));
}

/* Runner(handle, (bind, shape, execute, release), input_names, output_names, output_dtypes,
 *        dtype_codes, raise_status, torch) with stream_of and device_index for CUDA. */
static PyObject* Runner_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static char* kw[] = {
      "handle",      "functions",    "input_names", "output_names", "output_dtypes",
      "dtype_codes", "raise_status", "torch",       "stream_of",    "device_index",
      NULL};
  PyObject *handle, *fns, *in_names, *out_names, *out_dtypes, *codes, *raise_status, *torch;
  PyObject *stream_of = Py_None, *device_index = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!O!O!O!OO|OO:Runner", kw, &handle,
                                   &PyTuple_Type, &fns, &PyTuple_Type, &in_names, &PyTuple_Type,
                                   &out_names, &PyTuple_Type, &out_dtypes, &PyDict_Type, &codes,
                                   &raise_status, &torch, &stream_of, &device_index)) {
    return NULL;
  }
  if (PyTuple_Size(fns) != 4 || PyTuple_Size(out_dtypes) != PyTuple_Size(out_names)) {
    PyErr_SetString(PyExc_ValueError, "Runner: four functions, one dtype per output");
    return NULL;
  }
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  Runner* r = (Runner*)alloc(type, 0);
  if (!r) return NULL;
  r->ctx = PyLong_AsVoidPtr(handle);
  r->bind = (BindFn)Address(fns, 0);
  r->shape = (ShapeFn)Address(fns, 1);
  r->execute = (ExecuteFn)Address(fns, 2);
  r->release = (ReleaseFn)Address(fns, 3);
  if (PyErr_Occurred()) goto error;
  if (!r->ctx || !r->bind || !r->shape || !r->execute || !r->release) {
    PyErr_SetString(PyExc_ValueError, "Runner: a NULL handle or function");
    goto error;
  }
  r->n_in = PyTuple_Size(in_names);
  r->n_out = PyTuple_Size(out_names);
  r->b = PyMem_Calloc((size_t)(r->n_in + r->n_out) + 1, sizeof(Binding));
  r->out_shapes = PyMem_Calloc((size_t)r->n_out + 1, sizeof(PyObject*));
  r->in_index = PyDict_New();
  if (!r->b || !r->out_shapes || !r->in_index) goto error;
  for (Py_ssize_t i = 0; i < r->n_in + r->n_out; ++i) {
    PyObject* name =
        i < r->n_in ? PyTuple_GetItem(in_names, i) : PyTuple_GetItem(out_names, i - r->n_in);
    r->b[i].name = PyUnicode_AsUTF8String(name);
    if (!r->b[i].name) goto error;
    r->b[i].t.dims = r->b[i].dims;
    r->b[i].t.strides = r->b[i].strides;
    if (i < r->n_in) {
      PyObject* index = PyLong_FromSsize_t(i);
      int bad = !index || PyDict_SetItem(r->in_index, name, index) < 0;
      Py_XDECREF(index);
      if (bad) goto error;
    }
  }
  r->empty = PyObject_GetAttrString(torch, "empty");
  r->tensor_type = PyObject_GetAttrString(torch, "Tensor");
  r->strided = PyObject_GetAttrString(torch, "strided");
  if (!r->empty || !r->tensor_type || !r->strided) goto error;
  Py_INCREF(out_names);
  r->out_names = out_names;
  Py_INCREF(out_dtypes);
  r->out_dtypes = out_dtypes;
  Py_INCREF(codes);
  r->dtype_codes = codes;
  Py_INCREF(raise_status);
  r->raise_status = raise_status;
  Py_INCREF(stream_of);
  r->stream_of = stream_of;
  Py_INCREF(device_index);
  r->device_index = device_index;
  return (PyObject*)r;
error:
  Py_DECREF(r);
  return NULL;
}

static PyMethodDef Runner_methods[] = {
    {"run", (PyCFunction)Runner_run, METH_VARARGS,
     "run(inputs, outputs=None, stream=None) -> {name: tensor}, or None: take the Python path"},
    {"call", (PyCFunction)Runner_call, METH_O,
     "call(inputs_tuple) -> tensor or tuple, or None: take the Python path"},
    {"acquire", (PyCFunction)(void (*)(void))Runner_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True) -> bool: the context's lock (only tried; see above)"},
    {"release", (PyCFunction)Runner_release, METH_NOARGS, "release(): the context's lock"},
    {"forget", (PyCFunction)Runner_forget, METH_NOARGS,
     "The context was bound by someone else: recheck every binding on the next run"},
    {"close", (PyCFunction)Runner_close, METH_NOARGS,
     "The context is being freed: every later run takes the Python path"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Runner_getset[] = {
    {"runs", (getter)Runner_get_runs, NULL, "runs completed on this path", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Runner_slots[] = {
    {Py_tp_new, Runner_new},
    {Py_tp_dealloc, Runner_dealloc},
    {Py_tp_methods, Runner_methods},
    {Py_tp_getset, Runner_getset},
    {Py_tp_doc, "One execution context's hot path (kiln.ExecutionContext holds it)."},
    {0, NULL},
};

static PyType_Spec Runner_spec = {
    "kiln._fast.Runner", sizeof(Runner), 0, Py_TPFLAGS_DEFAULT, Runner_slots,
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT,
    "_fast",
    "The hot path of kiln.ExecutionContext.run in C (stable ABI); kiln works without it.",
    -1,
    NULL,
};

static int Intern(PyObject** slot, const char* text) {
  *slot = PyUnicode_InternFromString(text);
  return *slot ? 0 : -1;
}

PyMODINIT_FUNC PyInit__fast(void) {
  if (Intern(&s_data_ptr, "data_ptr") || Intern(&s_shape, "shape") || Intern(&s_stride, "stride") ||
      Intern(&s_dtype, "dtype") || Intern(&s_device, "device") || Intern(&s_layout, "layout") ||
      Intern(&s_type, "type") || Intern(&s_index, "index") || Intern(&s_cpu, "cpu") ||
      Intern(&s_cuda, "cuda") || Intern(&s_cuda_stream, "cuda_stream")) {
    return NULL;
  }
  PyObject* m = PyModule_Create(&fast_module);
  if (!m) return NULL;
  PyObject* type = PyType_FromSpec(&Runner_spec);
  if (!type || PyModule_AddObject(m, "Runner", type) < 0 ||
      PyModule_AddIntConstant(m, "C_API_VERSION", KILN_C_API_VERSION) < 0) {
    Py_XDECREF(type);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
