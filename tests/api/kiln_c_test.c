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

int main(int argc, char** argv) {
  if (kiln_api_version() != KILN_C_API_VERSION) ++failures;
  kiln_build_config* c = NULL;
  if (!ok(kiln_build_config_create(&c), "config")) return 1;
  expect_code(kiln_build_config_set(c, "precision", "fp8"), 1001, "unknown option");
  expect_code(kiln_build_config_set(c, "deadline", "-5s"), 3004, "negative deadline");
  ok(kiln_build_config_set(c, "backend", "cpu"), "backend cpu");
  kiln_engine* e = NULL;
  static const char garbage[128] = "not an engine";
  expect_code(kiln_engine_deserialize(garbage, sizeof garbage, &e), 4000, "garbage engine");
  expect_code(kiln_status_make(5013, "strided"), 5013, "status_make");
  kiln_status* s = kiln_status_make(5013, "strided");
  if (strcmp(kiln_status_id(s), "KILN-E5013") != 0 || strcmp(kiln_status_message(s), "strided")) {
    ++failures;
  }
  kiln_status_free(s);
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
