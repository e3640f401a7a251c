/* kiln's stable C API: build, save/load, execution contexts and build-once over opaque handles,
 * so that C, Python (ctypes), Rust and Go reach the one C++ implementation through one binary
 * (libkiln_c.so) whatever their version. Every fallible call returns a kiln_status*: NULL is
 * success; otherwise the caller reads its catalog code, message and remedy and frees it.
 * Nothing here aborts on caller input. */
#ifndef KILN_C_H_
#define KILN_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: kiln_comm.split and kiln_build_once_options (build_on, cache_dir).
 * 3: refit (kiln_engine_refit*, kiln_named_tensor, kiln_engine_weights_generation,
 *    kiln_engine_refit_group, kiln_refit_weights).
 * 4: weight-stripped engines (kiln_engine_serialize_stripped, kiln_engine_save_stripped,
 *    kiln_engine_load_with_weights, kiln_engine_deserialize_with_weights).
 * 5: data-dependent output dims (kiln_engine_binding_data_dependent, kiln_context_max_shape;
 *    kiln_context_shape gives the dims the last execute reported). */
#define KILN_C_API_VERSION 5

typedef struct kiln_status kiln_status;
typedef struct kiln_build_config kiln_build_config;
typedef struct kiln_engine kiln_engine;
typedef struct kiln_context kiln_context;
typedef struct kiln_buffer kiln_buffer;

/* ---- status ---- */
/* The catalog number (5001 for KILN-E5001). */
int kiln_status_code(const kiln_status* s);
/* "KILN-E5001" */
const char* kiln_status_id(const kiln_status* s);
/* The catalog name ("InputTypeMismatch"). */
const char* kiln_status_name(const kiln_status* s);
/* What happened, with the context it gained on its way up. */
const char* kiln_status_message(const kiln_status* s);
/* What to do (the catalog's remedy). */
const char* kiln_status_remedy(const kiln_status* s);
void kiln_status_free(kiln_status* s);
/* A status for catalog code `code` (its remedy from the catalog) and `message`: bindings raise
 * their own checks with the catalog's words. An unknown code gives KILN-E1000. */
kiln_status* kiln_status_make(int code, const char* message);

/* ---- owned byte buffers (engines, JSON) ---- */
const uint8_t* kiln_buffer_data(const kiln_buffer* b);
size_t kiln_buffer_size(const kiln_buffer* b);
void kiln_buffer_free(kiln_buffer* b);

int kiln_api_version(void);
/* "0.1.0" */
const char* kiln_version(void);

/* ---- tensors: borrowed memory described like DLPack ---- */
enum kiln_dtype {
  KILN_DTYPE_FLOAT32 = 1,
  KILN_DTYPE_FLOAT16 = 2,
  KILN_DTYPE_BFLOAT16 = 3,
  KILN_DTYPE_INT8 = 4,
  KILN_DTYPE_UINT8 = 5,
  KILN_DTYPE_INT32 = 6,
  KILN_DTYPE_INT64 = 7,
  KILN_DTYPE_BOOL = 8,
  KILN_DTYPE_FLOAT64 = 9,
  KILN_DTYPE_INT16 = 10,
  KILN_DTYPE_UINT16 = 11,
  KILN_DTYPE_UINT32 = 12,
  KILN_DTYPE_UINT64 = 13,
};
/* DLPack's device type numbers. */
enum kiln_device_type { KILN_DEVICE_CPU = 1, KILN_DEVICE_CUDA = 2 };

typedef struct kiln_tensor {
  void* data;
  int32_t dtype;          /* enum kiln_dtype */
  int32_t ndim;           /* at most KILN_MAX_DIMS */
  const int64_t* dims;    /* ndim entries */
  const int64_t* strides; /* in elements, ndim entries; NULL: dense row-major */
  int32_t device_type;    /* enum kiln_device_type */
  int32_t device_id;
} kiln_tensor;

#define KILN_MAX_DIMS 16

/* ---- build ---- */
kiln_status* kiln_build_config_create(kiln_build_config** out);
void kiln_build_config_free(kiln_build_config* c);
/* One option, as its CLI flag takes it (the CLI's parsers read it):
 *   backend          auto | cpu | cuda
 *   fp16, bf16, int8, fp8  0 | 1
 *   profile          NAME:MIN,OPT,MAX (dims as 1x3x224x224); repeat for each dynamic input
 *   deadline         30s | 5m | 1500ms
 *   memory_budget    512M | 8G | 0.5 (a fraction of free memory)
 *   max_kernel_time  milliseconds
 *   timing_cache     path
 *   calib_dir        DIR/test_data_set_N/input_I.pb
 *   calib_method     minmax | entropy | percentile[=P]
 *   calib_percentile in (0, 100]: the percentile method's share of |x| kept (set after the method)
 *   calib_cache      path
 *   calib_on_cpu     0 | 1: calibrate on the CPU reference even for a GPU build (default 0)
 *   int8_tolerance   a number or "off"
 *   fp8_tolerance    a number or "off"
 *   fp8_edges, int8_edges  0 | 1: quantized values between two FP8 (INT8) products whose
 *                    kernels can (default 1; the CLI's --no-fp8-edges / --no-int8-edges)
 *   quantized_if_faster  0 | 1 | auto: a quantized layer's tactics race its float ones and the
 *                    layer runs float where one is faster (default auto: on for cuda, off for
 *                    cpu; the CLI's --quantized-if-faster)
 *   optimize         0 | 1
 * An unknown key or a bad value is KILN-E1001 naming it. */
kiln_status* kiln_build_config_set(kiln_build_config* c, const char* key, const char* value);
/* Called for each progress step of a build; returning 0 cancels it (the tactic phase then keeps
 * the best engine so far, as TensorRT's progress monitor does). */
typedef int (*kiln_progress_fn)(void* user, const char* phase, int64_t done, int64_t total,
                                double elapsed_s, const char* detail);
void kiln_build_config_set_progress(kiln_build_config* c, kiln_progress_fn fn, void* user);

/* Builds an engine (loaded for its backend, ready for contexts) from an ONNX file or bytes. */
kiln_status* kiln_build_from_file(const kiln_build_config* c, const char* onnx_path,
                                  kiln_engine** out);
kiln_status* kiln_build_from_bytes(const kiln_build_config* c, const void* onnx, size_t size,
                                   const char* model_name, kiln_engine** out);

/* ---- engines ---- */
/* Loads a .kiln file or engine bytes for the backend it was built for: KILN-E4004 when it targets
 * another device architecture, KILN-E5006 when its GPU backend cannot run here, KILN-E4010 for a
 * weight-stripped engine (kiln_engine_load_with_weights loads those). */
kiln_status* kiln_engine_load(const char* path, kiln_engine** out);
kiln_status* kiln_engine_deserialize(const void* data, size_t size, kiln_engine** out);
void kiln_engine_free(kiln_engine* e);
/* The engine's bytes (deterministic: the same engine gives the same bytes); after a refit, the
 * refit engine's. */
kiln_status* kiln_engine_serialize(const kiln_engine* e, kiln_buffer** out);
/* Atomic write (temporary file, then rename). */
kiln_status* kiln_engine_save(const kiln_engine* e, const char* path);
/* The build report as JSON (the one `kiln build --report` writes; "{}" for loaded engines). */
kiln_status* kiln_engine_report_json(const kiln_engine* e, kiln_buffer** out);
/* "cpu" or "cuda", and the device architecture it targets ("x86_64", "sm_90"). */
const char* kiln_engine_backend(const kiln_engine* e);
const char* kiln_engine_arch(const kiln_engine* e);
/* Inputs first, then outputs. */
int kiln_engine_num_bindings(const kiln_engine* e);
/* Binding i: its name, whether it is an input, its dtype and its dims (-1 where dynamic;
 * dims_out holds KILN_MAX_DIMS). */
kiln_status* kiln_engine_binding(const kiln_engine* e, int i, const char** name, int* is_input,
                                 int32_t* dtype, int32_t* ndim, int64_t* dims_out);
/* Which dims of binding i follow from tensor VALUES (NonZero's count, Unique's, Compress's,
 * NonMaxSuppression's, TopK's with a run-time K; docs/architecture.md "Data-dependent shapes"):
 * bit k of *mask set for dim k. 0 for inputs and for outputs whose dims follow from the input
 * shapes alone. Such an output is bound at kiln_context_max_shape; each execute writes it densely
 * at the dims it finds (its leading bytes), and kiln_context_shape gives those dims. */
kiln_status* kiln_engine_binding_data_dependent(const kiln_engine* e, int i, uint32_t* mask);
/* An input's profile (min, opt, max; each KILN_MAX_DIMS); *has_profile = 0 for static inputs. */
kiln_status* kiln_engine_profile(const kiln_engine* e, const char* input, int* has_profile,
                                 int32_t* ndim, int64_t* min, int64_t* opt, int64_t* max);

/* ---- refit: new weights into a loaded engine (docs/refit.md) ---- */
/* One weight by initializer name: host memory (device_type KILN_DEVICE_CPU), dense row-major
 * (strides NULL or dense), copied during the call. */
typedef struct kiln_named_tensor {
  const char* name;
  kiln_tensor tensor;
} kiln_named_tensor;
/* Replays the engine's weight program on new initializers: from an ONNX file, ONNX bytes, or
 * `count` named tensors. The new weights are complete before they are published; every context
 * of the engine takes them at its next execute (never during one), and runs already enqueued
 * finish with the old ones. Afterwards kiln_engine_serialize and kiln_engine_save give the refit
 * engine (its model hash is the new file's or bytes' hash; for named tensors, a hash of them).
 * Wrong weights (one missing or extra, another dtype or shape: KILN-E4008; a changed initializer
 * that shaped the engine: KILN-E4009; an engine without a weight program: KILN-E4007) name the
 * first mismatch, and the engine is unchanged. Refits of one engine are serialised; any thread.
 * *report_json (optional) gets what was done: constants replaced, steps replayed, timings and
 * the new weights generation. */
kiln_status* kiln_engine_refit_from_file(kiln_engine* e, const char* onnx_path,
                                         kiln_buffer** report_json);
kiln_status* kiln_engine_refit_from_bytes(kiln_engine* e, const void* onnx, size_t size,
                                          kiln_buffer** report_json);
kiln_status* kiln_engine_refit(kiln_engine* e, const kiln_named_tensor* weights, size_t count,
                               kiln_buffer** report_json);
/* 0 as built or loaded; +1 per successful refit. */
uint64_t kiln_engine_weights_generation(const kiln_engine* e);

/* ---- execution contexts ---- */
/* cuda_graphs: capture on the first execute after shapes or addresses change, replay after. A
 * context is for one thread at a time: a call made while another thread is between its first
 * bind and its execute is KILN-E5011. */
kiln_status* kiln_context_create(const kiln_engine* e, int cuda_graphs, kiln_context** out);
void kiln_context_free(kiln_context* c);
/* Binds caller memory to an input (setting its shape from the tensor) or an output (whose dims
 * must be the ones the inputs imply: kiln_context_max_shape's). Checked: name (E5005), dtype
 * (E5001), device (E5012), layout (E5013), shape (E5002/E5003/E5014). Nothing is copied, but for a
 * shape input (an input whose values shape the engine, docs/architecture.md "Shape inputs"): its
 * values are read on the host, so on a CUDA engine it may be given in host memory, and one given in
 * device memory is copied to the host here (a synchronous copy of its few bytes). */
kiln_status* kiln_context_bind(kiln_context* c, const char* name, const kiln_tensor* t);
/* The dims of an input or output once every input is bound (dims_out holds KILN_MAX_DIMS). A
 * data-dependent dim (kiln_engine_binding_data_dependent) reads as its bound until an execute
 * reports it; after an execute it gives the dims that execute reported, the output's actual
 * shape (its leading bytes hold the output, dense at those dims), until the next execute or a
 * change of an input's shape (then the bound again). Before the first execute and for engines
 * without data-dependent dims it equals kiln_context_max_shape. */
kiln_status* kiln_context_shape(kiln_context* c, const char* name, int32_t* ndim,
                                int64_t* dims_out);
/* The dims to allocate and bind an output at: kiln_context_shape's with every data-dependent dim
 * at its bound for the bound input shapes (any count an execute may report fits). */
kiln_status* kiln_context_max_shape(kiln_context* c, const char* name, int32_t* ndim,
                                    int64_t* dims_out);
/* Enqueues the engine on `stream` (a cudaStream_t; NULL on the CPU). No device-wide sync: on
 * CUDA the outputs are ready when the stream reaches this point. */
kiln_status* kiln_context_execute(kiln_context* c, void* stream);
/* Ends a bind...execute sequence without executing (the caller gave up half way). */
void kiln_context_release(kiln_context* c);
/* Graph statistics: captures made and graph launches. */
int64_t kiln_context_graph_captures(const kiln_context* c);
int64_t kiln_context_graph_launches(const kiln_context* c);

/* ---- build once per job over the caller's process group ---- */
/* A process group the caller owns (torch.distributed, MPI, ...), as callbacks. Each returns 0 on
 * success, 1 when it passed timeout_s, 2 when it failed otherwise; kiln turns them into
 * KILN-E7016 and KILN-E7023. */
typedef struct kiln_comm kiln_comm;
struct kiln_comm {
  void* user;
  int rank;
  int size;
  /* Every rank contributes `size` bytes at `mine`; `out` receives size x ranks bytes, rank order.
   */
  int (*allgather)(void* user, const void* mine, size_t size, void* out, double timeout_s);
  /* root's `size` bytes land in every rank's `bytes`. */
  int (*broadcast)(void* user, void* bytes, size_t size, int root, double timeout_s);
  /* Optional (NULL: the group cannot be split, and build_on per-node/per-arch with more than one
   * group is KILN-E7027). Collective over this group: the ranks that pass the same color form a
   * new group, ordered by key, which the callback describes in *out. kiln uses it until
   * kiln_build_once returns; the caller releases it afterwards. */
  int (*split)(void* user, int color, int key, kiln_comm* out, double timeout_s);
};

/* How kiln_build_once waits and groups; zero-initialise, then set what you need (a zero timeout
 * takes its default). */
typedef struct kiln_build_once_options {
  double join_timeout_s;     /* every rank arrives within this (default 60) */
  double wait_timeout_s;     /* for the builder: build, or cache wait (default 1800) */
  double transfer_timeout_s; /* for the bytes (default 300) */
  /* > 0: the builder sends its progress line to the others about every second (they get it
   * through the config's progress callback as phase "builder", the line as detail), and a
   * builder silent that long fails them with KILN-E7003. 0: no heartbeats. */
  double heartbeat_timeout_s;
  /* NULL or "rank0": one builder per job; "per-node": one per node (KILN_DIST_NODE, else the
   * host name); "per-arch": one per device architecture. Groups need kiln_comm.split. */
  const char* build_on;
  /* NULL: no cache. A directory: the builders go through the shared engine cache there (file
   * lock, heartbeat, atomic publish): a hit is read, not built, and builders of several groups
   * (per-node) or several jobs build one engine between them. */
  const char* cache_dir;
  /* 1: accept a cache directory other users can write (KILN-E7010 otherwise). */
  int trust_shared_cache;
} kiln_build_once_options;

/* Every rank of `comm` calls this with the same model and options (NULL: the defaults): the
 * lowest rank of each group builds (or reads the cache), the others wait (bounded) and receive the
 * bytes through `comm`, each rank checks their checksum and loads them. A builder that fails fails
 * every rank of its group (KILN-E7011 with its error on the others); a builder that dies is
 * KILN-E7020 on the others; ranks whose keys differ fail with KILN-E7004. *report_json (optional)
 * gets who built and who waited how long. */
kiln_status* kiln_build_once(const kiln_build_config* c, const void* onnx, size_t size,
                             const char* model_name, const kiln_comm* comm,
                             const kiln_build_once_options* options, kiln_engine** out,
                             kiln_buffer** report_json);

/* ---- refit across the ranks of a group ---- */
/* One rank's new weights: ONNX model bytes (onnx, onnx_size) or named host tensors (tensors,
 * count), not both. */
typedef struct kiln_refit_weights {
  const void* onnx;
  size_t onnx_size;
  const kiln_named_tensor* tensors;
  size_t count;
} kiln_refit_weights;

/* Every rank of `comm` calls this with its engine (the one kiln_build_once gave every rank, with
 * the same refits since: KILN-E7028 otherwise) and its new weights, or NULL when it holds none.
 * When every rank holds them, each refits locally and nothing is sent. Otherwise the lowest rank
 * that holds them checks and replays the refit and broadcasts only the constants whose bytes
 * changed; the others publish those. Ranks that pass weights must pass the same ones (KILN-E7028).
 * A refit error (KILN-E4007..E4009) reaches every rank, and no engine changes. timeout_s (0: 300)
 * bounds each exchange. *report_json (optional): mode ("local" or "relay"), source, holders,
 * constants_sent, bytes_sent, generation, and the refit's report where this rank computed it. */
kiln_status* kiln_engine_refit_group(kiln_engine* e, const kiln_refit_weights* weights,
                                     const kiln_comm* comm, double timeout_s,
                                     kiln_buffer** report_json);

/* ---- weight-stripped engines (`kiln build --strip-weights`, docs/refit.md) ---- */
/* The engine's bytes, or an atomic write of them, without the weights its weight program makes
 * from the model (layers, tactics, plan and program; literals stay): for caches and for ranks that
 * hold the model. The engine itself keeps its weights. KILN-E4007 / KILN-E4009 for an engine
 * that refit could not fill again (no program, or a non-refittable constant). */
kiln_status* kiln_engine_serialize_stripped(const kiln_engine* e, kiln_buffer** out);
kiln_status* kiln_engine_save_stripped(const kiln_engine* e, const char* path);
/* Loads an engine file or engine bytes, fills it with weights, then loads it for its backend as
 * kiln_engine_load does. A weight-stripped engine (layers, tactics, plan and weight program, no
 * weight bytes) needs this; a full one is refit. The weights: `onnx_path` (an ONNX file, external
 * data beside it) or `weights` (ONNX bytes or named host tensors, as kiln_engine_refit_group
 * takes them), exactly one (KILN-E1001 otherwise). The result is the engine a build of those
 * weights makes: kiln_engine_serialize and kiln_engine_save give the full engine, byte for byte
 * what `kiln build` of the model writes with the same tactics. Wrong weights fail as
 * kiln_engine_refit does (KILN-E4008 naming the first mismatch, KILN-E4009), and nothing is
 * loaded. *report_json (optional): the refit report ("filled_stripped": true for a stripped
 * engine) with "generation": 0. */
kiln_status* kiln_engine_load_with_weights(const char* path, const char* onnx_path,
                                           const kiln_refit_weights* weights, kiln_engine** out,
                                           kiln_buffer** report_json);
kiln_status* kiln_engine_deserialize_with_weights(const void* data, size_t size,
                                                  const char* onnx_path,
                                                  const kiln_refit_weights* weights,
                                                  kiln_engine** out, kiln_buffer** report_json);

#ifdef __cplusplus
}
#endif
#endif /* KILN_C_H_ */
