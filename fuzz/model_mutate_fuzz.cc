// libFuzzer target with structure: the input is a script of edits applied to a valid zoo model
// (graph input dims, initializer shapes and int64 values, integer attributes), then import,
// shape inference and memory planning run on the result. Byte-level mutation of a protobuf
// rarely survives parsing; this reaches the size arithmetic (ir/sizes.h) on every execution.
// Every outcome must be OK or a catalog error; a plan that succeeds must respect the limits.
#include <google/protobuf/repeated_field.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "kiln/core/logging.h"
#include "kiln/ir/sizes.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/op_schema.h"
#include "kiln/plan/memory_plan.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "model_mutate_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

// The zoo models small enough to mutate quickly, parsed once.
const std::vector<onnx::ModelProto>& Seeds() {
  static const auto* seeds = [] {
    auto* out = new std::vector<onnx::ModelProto>();
    std::filesystem::path zoo = std::filesystem::path(KILN_FUZZ_SOURCE_DIR) / "zoo";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(zoo, ec)) {
      std::filesystem::path model = entry.path() / "model.onnx";
      if (!std::filesystem::is_regular_file(model) || std::filesystem::file_size(model) > 600000) {
        continue;
      }
      std::ifstream f(model, std::ios::binary);
      onnx::ModelProto m;
      if (m.ParseFromIstream(&f)) out->push_back(std::move(m));
    }
    if (out->empty()) Fail("no seed models", zoo.string());
    return out;
  }();
  return *seeds;
}

// Reads the script: bytes are consumed in order, zeros once they run out.
class Script {
 public:
  Script(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  size_t Index(size_t n) { return n == 0 ? 0 : Byte() % n; }
  // A dimension or value: mostly the sizes that break arithmetic, sometimes raw bits.
  int64_t Value() {
    static constexpr int64_t kInteresting[] = {0,
                                               1,
                                               2,
                                               3,
                                               -1,
                                               -2,
                                               7,
                                               64,
                                               1000,
                                               int64_t{1} << 31,
                                               int64_t{1} << 32,
                                               (int64_t{1} << 38) + 1,
                                               int64_t{1} << 40,
                                               (int64_t{1} << 40) + 1,
                                               int64_t{1} << 62,
                                               std::numeric_limits<int64_t>::max(),
                                               std::numeric_limits<int64_t>::min()};
    uint8_t kind = Byte();
    if (kind < 200) return kInteresting[kind % std::size(kInteresting)];
    uint64_t raw = 0;
    for (int i = 0; i < 8; ++i) raw = raw << 8 | Byte();
    return static_cast<int64_t>(raw);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Keeps an initializer's data consistent with new dims when that is cheap (zeros), so that the
// edit reaches shape inference instead of the importer's length check.
void Refill(onnx::TensorProto* t) {
  int64_t n = 1;
  for (int64_t d : t->dims()) {
    if (d < 0 || (d > 0 && n > (int64_t{1} << 16) / d)) return;  // leave it: import refuses it
    n *= d;
  }
  t->clear_float_data();
  t->clear_int32_data();
  t->clear_int64_data();
  t->clear_double_data();
  t->clear_external_data();
  t->set_data_location(onnx::TensorProto::DEFAULT);
  size_t elem =
      t->data_type() == onnx::TensorProto::INT64 || t->data_type() == onnx::TensorProto::DOUBLE ? 8
                                                                                                : 4;
  t->set_raw_data(std::string(static_cast<size_t>(n) * elem, '\0'));
}

void Mutate(onnx::ModelProto& m, Script& s) {
  onnx::GraphProto& g = *m.mutable_graph();
  for (int edits = 0; edits < 16 && !s.done(); ++edits) {
    switch (s.Byte() % 4) {
      case 0: {  // a graph input dim
        if (g.input_size() == 0) break;
        auto* shape = g.mutable_input(static_cast<int>(s.Index(g.input_size())))
                          ->mutable_type()
                          ->mutable_tensor_type()
                          ->mutable_shape();
        if (shape->dim_size() == 0) break;
        shape->mutable_dim(static_cast<int>(s.Index(shape->dim_size())))->set_dim_value(s.Value());
        break;
      }
      case 1: {  // an initializer dim (data refilled when small)
        if (g.initializer_size() == 0) break;
        auto* t = g.mutable_initializer(static_cast<int>(s.Index(g.initializer_size())));
        if (t->dims_size() == 0) break;
        t->set_dims(static_cast<int>(s.Index(t->dims_size())), s.Value());
        Refill(t);
        break;
      }
      case 2: {  // an int64 initializer value (shape targets, pads, repeats, axes)
        std::vector<onnx::TensorProto*> ints;
        for (auto& t : *g.mutable_initializer()) {
          if (t.data_type() == onnx::TensorProto::INT64) ints.push_back(&t);
        }
        if (ints.empty()) break;
        onnx::TensorProto* t = ints[s.Index(ints.size())];
        const size_t n = t->has_raw_data() ? t->raw_data().size() / 8 : t->int64_data_size();
        if (n == 0) break;
        const size_t i = s.Index(n);
        const int64_t v = s.Value();
        if (t->has_raw_data()) {
          std::memcpy(t->mutable_raw_data()->data() + 8 * i, &v, 8);
        } else {
          t->set_int64_data(static_cast<int>(i), v);
        }
        break;
      }
      case 3: {  // an integer attribute (pads, strides, kernel_shape, axis, blocksize...)
        if (g.node_size() == 0) break;
        auto* n = g.mutable_node(static_cast<int>(s.Index(g.node_size())));
        if (n->attribute_size() == 0) break;
        auto* a = n->mutable_attribute(static_cast<int>(s.Index(n->attribute_size())));
        if (a->type() == onnx::AttributeProto::INT) {
          a->set_i(s.Value());
        } else if (a->type() == onnx::AttributeProto::INTS && a->ints_size() > 0) {
          a->set_ints(static_cast<int>(s.Index(a->ints_size())), s.Value());
        }
        break;
      }
    }
  }
}

// The profile kiln's tools would build with: every symbolic input dim gets the script's value
// as its max (min and opt 1), so plans are sized at hostile max shapes too.
kiln::OptimizationProfile ProfileFor(const kiln::Graph& graph, Script& s) {
  kiln::OptimizationProfile profile;
  for (const kiln::Value* in : graph.inputs()) {
    if (kiln::IsStatic(in->shape())) continue;
    kiln::InputProfile p;
    p.input = in->name();
    for (const kiln::Dim& d : in->shape()) {
      const int64_t fixed = d.is_static() ? d.value() : -1;
      const int64_t max = fixed >= 0 ? fixed : (s.done() ? 2 : s.Value());
      p.min.push_back(fixed >= 0 ? fixed : 1);
      p.opt.push_back(fixed >= 0 ? fixed : 1);
      p.max.push_back(max);
    }
    profile.inputs.push_back(std::move(p));
  }
  return profile;
}

void CheckError(const kiln::Status& s, const char* phase) {
  if (s.ok()) return;
  if (s.Id().empty() || s.message().empty()) Fail(phase, "error without code or message");
  if (s.code() == kiln::ErrorCode::kInternal) Fail(phase, s.ToString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    kiln::SetLogLevel(kiln::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  Script script(data, size);
  const auto& seeds = Seeds();
  onnx::ModelProto model = seeds[script.Index(seeds.size())];
  Mutate(model, script);
  const std::string bytes = model.SerializeAsString();

  auto graph = kiln::ImportOnnxBytes(std::as_bytes(std::span(bytes.data(), bytes.size())),
                                     "/nonexistent-kiln-fuzz-dir");
  if (!graph.ok()) return CheckError(graph.status(), "import"), 0;
  auto inferred = kiln::InferShapes(**graph);
  if (!inferred.ok()) return CheckError(inferred.status(), "shape inference"), 0;
  // Every inferred shape passed InferNode's size check: its static part is within the limits.
  for (const kiln::Value* v : (*graph)->values()) {
    if (!v->has_shape()) continue;
    kiln::Status s =
        kiln::CheckShapeSize(v->shape(), v->dtype(), kiln::ErrorCode::kTensorTooLarge, v->name());
    if (!s.ok()) Fail("an inferred shape is past the limits", s.ToString());
  }

  kiln::OptimizationProfile profile = ProfileFor(**graph, script);
  auto order = (*graph)->TopologicalOrder();
  if (!order.ok()) Fail("topological order after inference", order.status().ToString());
  std::vector<kiln::PlanLayer> layers;
  for (const kiln::Node* n : *order) layers.push_back({n, 0, true});
  auto plan = kiln::PlanMemoryDetailed(**graph, layers, profile);
  // Symbols that no input binds, profiles past the limits: refusals, never internal errors.
  if (!plan.ok()) return CheckError(plan.status(), "memory plan"), 0;
  const kiln::MemoryPlan& p = plan->plan;
  if (p.peak_bytes < 0 || p.peak_bytes > kiln::kMaxTotalBytes ||
      p.peak_bytes != p.weights_bytes + p.arena_bytes + p.workspace_bytes) {
    Fail("plan totals", std::to_string(p.peak_bytes));
  }
  for (const kiln::PlannedBuffer& b : plan->buffers) {
    if (b.bytes < 0 || b.bytes > kiln::kMaxTensorBytes + kiln::kPlanAlignment || b.offset < 0 ||
        b.offset + b.bytes > p.arena_bytes) {
      Fail("a planned buffer", b.value->name());
    }
  }
  return 0;
}
