/* kiln_c.h compiles as C and its status objects carry catalog codes: a C caller's view of the
 * API (the Python tests cover the rest through the same library). */
#include "kiln/api/kiln_c.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

static void expect_code(kiln_status* s, int code, const char* what) {
  if (!s || kiln_status_code(s) != code || strlen(kiln_status_remedy(s)) == 0) {
    fprintf(stderr, "FAIL %s: wanted %d, got %d (%s)\n", what, code, kiln_status_code(s),
            kiln_status_message(s));
    ++failures;
  }
  kiln_status_free(s);
}

/* 1 when `s` is success; otherwise reports it and counts a failure. */
static int ok(kiln_status* s, const char* what) {
  if (!s) return 1;
  fprintf(stderr, "FAIL %s: %s %s\n", what, kiln_status_id(s), kiln_status_message(s));
  kiln_status_free(s);
  ++failures;
  return 0;
}

static void expect(int cond, const char* what) {
  if (cond) return;
  fprintf(stderr, "FAIL %s\n", what);
  ++failures;
}

/* NonZero -> Transpose(perm 1,0) over x: float[3, 4], y: int64[n, 2] (opset 13). Made with onnx's
 * helper.make_graph([make_node("NonZero", ["x"], ["nz"]), make_node("Transpose", ["nz"], ["y"],
 * perm=[1, 0])], "nz", [x: FLOAT [3, 4]], [y: INT64 ["n", 2]]), ir_version 7. */
static const unsigned char kNonZeroModel[] = {
    8,   7,   58,  100, 10,  16, 10, 1,   120, 18,  2,   110, 122, 34, 7,  78,  111, 110, 90,
    101, 114, 111, 10,  33,  10, 2,  110, 122, 18,  1,   121, 34,  9,  84, 114, 97,  110, 115,
    112, 111, 115, 101, 42,  13, 10, 4,   112, 101, 114, 109, 64,  1,  64, 0,   160, 1,   7,
    18,  2,   110, 122, 90,  19, 10, 1,   120, 18,  14,  10,  12,  8,  1,  18,  8,   10,  2,
    8,   3,   10,  2,   8,   4,  98, 20,  10,  1,   121, 18,  15,  10, 13, 8,   7,   18,  9,
    10,  3,   18,  1,   110, 10, 2,  8,   2,   66,  4,   10,  0,   16, 13};

/* One run of the NonZero model on x: the output is bound at its bound (12 x 2), and afterwards
 * kiln_context_shape gives [count, 2] with the coordinates in the leading bytes, row-major as
 * numpy.transpose(numpy.nonzero(x)) lists them. */
static void check_nonzero_run(kiln_context* ctx, const float* x) {
  int64_t xdims[2] = {3, 4};
  kiln_tensor xt = {(void*)x, KILN_DTYPE_FLOAT32, 2, xdims, NULL, KILN_DEVICE_CPU, 0};
  if (!ok(kiln_context_bind(ctx, "x", &xt), "bind x")) return;
  int32_t ndim = 0;
  int64_t max[KILN_MAX_DIMS];
  if (!ok(kiln_context_max_shape(ctx, "y", &ndim, max), "max shape")) return;
  expect(ndim == 2 && max[0] == 12 && max[1] == 2, "y's max shape is [12, 2]");
  static int64_t y[24];
  for (int i = 0; i < 24; ++i) y[i] = -7;
  int64_t ydims[2] = {12, 2};
  kiln_tensor yt = {y, KILN_DTYPE_INT64, 2, ydims, NULL, KILN_DEVICE_CPU, 0};
  if (!ok(kiln_context_bind(ctx, "y", &yt), "bind y")) return;
  if (!ok(kiln_context_execute(ctx, NULL), "execute")) return;
  int64_t dims[KILN_MAX_DIMS];
  if (!ok(kiln_context_shape(ctx, "y", &ndim, dims), "shape after execute")) return;
  int64_t count = 0;
  for (int i = 0; i < 12; ++i) {
    if (x[i] == 0.0f) continue;
    expect(count < 12 && y[2 * count] == i / 4 && y[2 * count + 1] == i % 4, "y's coordinates");
    ++count;
  }
  expect(ndim == 2 && dims[0] == count && dims[1] == 2, "y's shape after execute is [count, 2]");
  /* The bound is unchanged, and the context is free again for another thread after the query. */
  if (ok(kiln_context_max_shape(ctx, "y", &ndim, max), "max shape after execute")) {
    expect(ndim == 2 && max[0] == 12 && max[1] == 2, "y's max shape after execute");
  }
}

int main(int argc, char** argv) {
  if (kiln_api_version() != KILN_C_API_VERSION) ++failures;
  kiln_build_config* c = NULL;
  if (!ok(kiln_build_config_create(&c), "config")) return 1;
  expect_code(kiln_build_config_set(c, "precision", "fp8"), 1001, "unknown option");
  expect_code(kiln_build_config_set(c, "deadline", "-5s"), 3004, "negative deadline");
  ok(kiln_build_config_set(c, "backend", "cpu"), "backend cpu");
  ok(kiln_build_config_set(c, "quantized_if_faster", "1"), "quantized_if_faster 1");
  ok(kiln_build_config_set(c, "quantized_if_faster", "auto"), "quantized_if_faster auto");
  expect_code(kiln_build_config_set(c, "quantized_if_faster", "sometimes"), 1001,
              "quantized_if_faster sometimes");
  kiln_engine* e = NULL;
  static const char garbage[128] = "not an engine";
  expect_code(kiln_engine_deserialize(garbage, sizeof garbage, &e), 4000, "garbage engine");
  expect_code(kiln_status_make(5013, "strided"), 5013, "status_make");
  kiln_status* s = kiln_status_make(5013, "strided");
  if (strcmp(kiln_status_id(s), "KILN-E5013") != 0 || strcmp(kiln_status_message(s), "strided")) {
    ++failures;
  }
  kiln_status_free(s);
  /* Data-dependent output dims: NonZero's count after each run, 0 included, on one context. */
  if (ok(kiln_build_from_bytes(c, kNonZeroModel, sizeof kNonZeroModel, "nonzero", &e),
         "build nonzero")) {
    uint32_t mask = 7;
    if (ok(kiln_engine_binding_data_dependent(e, 0, &mask), "data-dependent x")) {
      expect(mask == 0, "x has no data-dependent dim");
    }
    if (ok(kiln_engine_binding_data_dependent(e, 1, &mask), "data-dependent y")) {
      expect(mask == 1, "y's dim 0 is data-dependent");
    }
    expect_code(kiln_engine_binding_data_dependent(e, 2, &mask), 1007, "binding out of range");
    kiln_context* ctx = NULL;
    if (ok(kiln_context_create(e, 0, &ctx), "nonzero context")) {
      static const float a[12] = {0, 1, 0, 2, 3, 0, 0, 0, 0, 0, 4, 5};
      static const float zeros[12] = {0};
      static const float b[12] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
      check_nonzero_run(ctx, a);
      check_nonzero_run(ctx, zeros);
      check_nonzero_run(ctx, b);
      check_nonzero_run(ctx, a);
      kiln_context_free(ctx);
    }
    kiln_engine_free(e);
    e = NULL;
  }
  if (argc > 1) {
    /* The model given: build it, then check the bindings and the report. */
    ok(kiln_build_config_set(c, "profile", "input:1x3x64x64,2x3x64x64,2x3x64x64"), "profile");
    if (ok(kiln_build_from_file(c, argv[1], &e), "build")) {
      if (kiln_engine_num_bindings(e) < 2 || strcmp(kiln_engine_backend(e), "cpu") != 0) ++failures;
      kiln_buffer* json = NULL;
      if (!ok(kiln_engine_report_json(e, &json), "report") || kiln_buffer_size(json) < 10) {
        ++failures;
      }
      kiln_buffer_free(json);
      kiln_context* ctx = NULL;
      if (!ok(kiln_context_create(e, 0, &ctx), "context")) return 1;
      int64_t dims[2] = {1, 2};
      kiln_tensor t = {NULL, KILN_DTYPE_FLOAT32, 2, dims, NULL, KILN_DEVICE_CUDA, 0};
      static float data[2];
      t.data = data;
      const char* name;
      int is_input;
      int32_t dtype, ndim;
      int64_t d[KILN_MAX_DIMS];
      if (!ok(kiln_engine_binding(e, 0, &name, &is_input, &dtype, &ndim, d), "binding")) return 1;
      expect_code(kiln_context_bind(ctx, name, &t), 5012, "CUDA tensor on a CPU engine");
      /* Refit with the model's own weights: a new generation; wrong weights change nothing. */
      kiln_buffer* refit = NULL;
      if (ok(kiln_engine_refit_from_file(e, argv[1], &refit), "refit from file")) {
        if (kiln_engine_weights_generation(e) != 1 || kiln_buffer_size(refit) < 10) ++failures;
        kiln_buffer_free(refit);
      }
      kiln_named_tensor w = {"no_such_initializer", t};
      w.tensor.device_type = KILN_DEVICE_CPU;
      expect_code(kiln_engine_refit(e, &w, 1, NULL), 4008, "refit with foreign weights");
      w.tensor.device_type = KILN_DEVICE_CUDA;
      expect_code(kiln_engine_refit(e, &w, 1, NULL), 5012, "refit with a CUDA weight");
      expect_code(kiln_engine_refit_from_bytes(e, garbage, sizeof garbage, NULL), 2000,
                  "refit from garbage bytes");
      expect_code(kiln_engine_refit_group(e, NULL, NULL, 0, NULL), 1001,
                  "refit_group without comm");
      if (kiln_engine_weights_generation(e) != 1) ++failures;
      /* Weight-stripped: smaller bytes that load only with weights, and then give the engine's
       * full bytes again (the model file's own weights: the same model hash). */
      kiln_buffer *full = NULL, *stripped = NULL, *again = NULL;
      if (ok(kiln_engine_serialize(e, &full), "serialize") &&
          ok(kiln_engine_serialize_stripped(e, &stripped), "serialize stripped")) {
        if (kiln_buffer_size(stripped) >= kiln_buffer_size(full)) ++failures;
        kiln_engine* se = NULL;
        expect_code(
            kiln_engine_deserialize(kiln_buffer_data(stripped), kiln_buffer_size(stripped), &se),
            4010, "stripped engine without weights");
        kiln_refit_weights wrong = {NULL, 0, &w, 1};
        w.tensor.device_type = KILN_DEVICE_CPU;
        expect_code(
            kiln_engine_deserialize_with_weights(
                kiln_buffer_data(stripped), kiln_buffer_size(stripped), NULL, &wrong, &se, NULL),
            4008, "stripped engine with foreign weights");
        expect_code(
            kiln_engine_deserialize_with_weights(
                kiln_buffer_data(stripped), kiln_buffer_size(stripped), argv[1], &wrong, &se, NULL),
            1001, "both an ONNX path and weights");
        if (ok(kiln_engine_deserialize_with_weights(kiln_buffer_data(stripped),
                                                    kiln_buffer_size(stripped), argv[1], NULL, &se,
                                                    NULL),
               "stripped engine with its weights") &&
            ok(kiln_engine_serialize(se, &again), "serialize the filled engine")) {
          if (kiln_buffer_size(again) != kiln_buffer_size(full) ||
              memcmp(kiln_buffer_data(again), kiln_buffer_data(full), kiln_buffer_size(full))) {
            ++failures;
          }
        }
        kiln_buffer_free(again);
        kiln_engine_free(se);
      }
      kiln_buffer_free(full);
      kiln_buffer_free(stripped);
      kiln_context_free(ctx);
      kiln_engine_free(e);
    }
  }
  kiln_build_config_free(c);
  printf("%s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
