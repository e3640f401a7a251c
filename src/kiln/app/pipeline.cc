// BuildFromOnnx*, HostRunner and tensor comparison.
#include "kiln/app/pipeline.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>

#include "kiln/core/hash.h"
#include "kiln/onnx/onnx_import.h"

namespace kiln::app {

StatusOr<BuiltEngine> BuildFromOnnxBytes(std::span<const std::byte> bytes, const std::string& name,
                                         const BuilderConfig& config) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, ImportOnnxBytes(bytes, ""));
  BuiltEngine out;
  BuildInput input{std::move(graph), name, HashBytes(bytes)};
  KILN_ASSIGN_OR_RETURN(out.desc, BuildEngine(std::move(input), config, &out.report));
  return out;
}

StatusOr<BuiltEngine> BuildFromOnnxFile(const std::string& path, const BuilderConfig& config,
                                        const ImportOptions* import) {
  // The engine key hashes the file's bytes; the importer hashes them as it parses them.
  ImportOptions options = import ? *import : ImportOptions{};
  options.hash_file = true;
  OnnxModelMeta meta;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, ImportOnnxFile(path, options, &meta));
  if (!options.sequence_inputs.empty() || !options.absent_inputs.empty()) {
    // Another specialisation of the same file is another engine.
    std::string key = meta.file_hash.Hex();
    for (const auto& [name, spec] : options.sequence_inputs) {
      key += fmt::format("|seq {}={}:{}", name, spec.length, spec.element_rank);
    }
    for (const auto& name : options.absent_inputs) key += fmt::format("|absent {}", name);
    meta.file_hash = HashString(key);
  }
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name == "model.onnx" && path.find('/') != std::string::npos) {
    std::string dir = path.substr(0, path.find_last_of('/'));
    name = dir.substr(dir.find_last_of('/') + 1);
  }
  BuiltEngine out;
  BuildInput input{std::move(graph), name, meta.file_hash};
  KILN_ASSIGN_OR_RETURN(out.desc, BuildEngine(std::move(input), config, &out.report));
  return out;
}

Status ParseSequenceInputSpec(const std::string& spec, ImportOptions* options) {
  auto bad = [&] {
    return MakeError(ErrorCode::kCommandLineInvalid,
                     "--sequence-input '{}': expected NAME=LENGTH or NAME=LENGTH:RANK (a "
                     "sequence input of LENGTH tensors, each of RANK dims when the model does "
                     "not declare the elements' shape), e.g. pieces=3 or pieces=3:2",
                     spec);
  };
  const size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0) return bad();
  std::string name = spec.substr(0, eq), rest = spec.substr(eq + 1);
  SequenceInputSpec s;
  std::string len = rest, rank;
  if (size_t colon = rest.find(':'); colon != std::string::npos) {
    len = rest.substr(0, colon);
    rank = rest.substr(colon + 1);
  }
  auto parse = [](const std::string& text, int64_t* out) {
    if (text.empty() || text.size() > 9) return false;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
    }
    *out = std::stoll(text);
    return true;
  };
  int64_t r = -1;
  if (!parse(len, &s.length) || (!rank.empty() && !parse(rank, &r))) return bad();
  s.element_rank = static_cast<int>(r);
  options->sequence_inputs[name] = s;
  return OkStatus();
}

StatusOr<std::unique_ptr<HostRunner>> HostRunner::Create(std::shared_ptr<const Engine> engine,
                                                         const ExecutionOptions& options) {
  auto r = std::unique_ptr<HostRunner>(new HostRunner());
  r->engine_ = std::move(engine);
  KILN_ASSIGN_OR_RETURN(r->context_, r->engine_->CreateExecutionContext(options));
  return r;
}

Status HostRunner::SetInputs(const std::map<std::string, Tensor>& inputs) {
  inputs_ = inputs;
  outputs_.clear();
  bound_outputs_.clear();
  device_buffers_.clear();
  to_host_.clear();
  to_device_.clear();
  Backend& backend = engine_->backend();
  bool host = backend.host_accessible();
  for (const TensorDesc& d : engine_->inputs()) {
    auto it = inputs_.find(d.name);
    if (it == inputs_.end()) {
      return MakeError(ErrorCode::kInputCountMismatch, "no value given for engine input '{}'",
                       d.name);
    }
    if (it->second.dtype() != d.dtype) {
      return MakeError(ErrorCode::kInputTypeMismatch, "input '{}' is {}; the engine expects {}",
                       d.name, ToString(it->second.dtype()), ToString(d.dtype));
    }
    KILN_RETURN_IF_ERROR(context_->SetInputShape(d.name, it->second.dims()));
  }
  for (const TensorDesc& d : engine_->inputs()) {
    Tensor& t = inputs_.at(d.name);
    if (host || d.shape_values) {  // a shape input's values are read from host memory
      KILN_RETURN_IF_ERROR(context_->SetTensorAddress(d.name, t.mutable_raw()));
    } else {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer buf, backend.Allocate(t.size_bytes()));
      KILN_RETURN_IF_ERROR(context_->SetTensorAddress(d.name, buf.data()));
      to_device_.push_back({&t, buf.data()});
      device_buffers_.push_back(std::move(buf));
    }
  }
  for (const TensorDesc& d : engine_->outputs()) {
    // Sized for any data-dependent dim's bound; Run cuts outputs_ to the reported dims.
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, context_->GetMaxTensorShape(d.name));
    Tensor* target = &(outputs_[d.name] = Tensor(d.dtype, dims));
    if (engine_->has_data_dependent_dims()) target = &(bound_outputs_[d.name] = *target);
    Tensor& t = *target;
    if (host) {
      KILN_RETURN_IF_ERROR(context_->SetTensorAddress(d.name, t.mutable_raw()));
    } else {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer buf, backend.Allocate(t.size_bytes()));
      KILN_RETURN_IF_ERROR(context_->SetTensorAddress(d.name, buf.data()));
      to_host_.push_back({buf.data(), &t});
      device_buffers_.push_back(std::move(buf));
    }
  }
  return OkStatus();
}

Status HostRunner::CopyInputs() {
  Backend& backend = engine_->backend();
  for (auto& [t, dev] : to_device_) {
    KILN_RETURN_IF_ERROR(backend.CopyToDevice(dev, t->raw(), t->size_bytes(), nullptr));
  }
  return OkStatus();
}

Status HostRunner::CopyOutputs() {
  // Work enqueued on the context's own stream (ProfileEngine passes it explicitly) is finished
  // first; the copies then run on the legacy stream, after anything Execute(nullptr) ordered.
  Backend& backend = engine_->backend();
  if (void* s = context_->stream()) KILN_RETURN_IF_ERROR(backend.Synchronize(s));
  for (auto& [dev, t] : to_host_) {
    KILN_RETURN_IF_ERROR(backend.CopyToHost(t->mutable_raw(), dev, t->size_bytes(), nullptr));
  }
  KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
  // Data-dependent outputs: the bytes bound to the context hold the bounds; what the caller
  // reads is the leading part at the dims the run reported (dense, so a prefix).
  for (const auto& [name, bound] : bound_outputs_) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, context_->GetTensorShape(name));
    if (dims == bound.dims()) {
      outputs_[name] = bound;
      continue;
    }
    Tensor actual(bound.dtype(), dims);
    if (actual.size_bytes() > bound.size_bytes()) {
      return MakeError(ErrorCode::kInternal, "output '{}' has dims [{}] past its bound [{}]", name,
                       fmt::join(dims, ","), fmt::join(bound.dims(), ","));
    }
    if (actual.size_bytes() > 0)
      std::memcpy(actual.mutable_raw(), bound.raw(), actual.size_bytes());
    outputs_[name] = std::move(actual);
  }
  return OkStatus();
}

Status HostRunner::Run() {
  KILN_RETURN_IF_ERROR(CopyInputs());
  KILN_RETURN_IF_ERROR(context_->Execute(nullptr));
  return CopyOutputs();
}

std::string Comparison::ToString() const {
  if (!shape_ok) return "shape mismatch";
  if (!dtype_ok) return "dtype mismatch";
  return fmt::format("max_abs {:.3g} max_rel {:.3g} rel_l2 {:.3g}{}", max_abs, max_rel, rel_l2,
                     mismatches ? fmt::format(" ({} elements out of tolerance)", mismatches) : "");
}

Comparison CompareTensors(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  Comparison c;
  if (actual.dims() != expected.dims()) {
    c.shape_ok = false;
    return c;
  }
  c.dtype_ok =
      actual.dtype() == expected.dtype() || (IsFloat(actual.dtype()) && IsFloat(expected.dtype()));
  double diff2 = 0, ref2 = 0;
  int64_t n = expected.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    double a = actual.GetDouble(i), e = expected.GetDouble(i);
    if (std::isnan(a) || std::isnan(e)) {
      if (std::isnan(a) != std::isnan(e)) ++c.nan_mismatch;
      continue;
    }
    if (std::isinf(a) || std::isinf(e)) {
      if (a != e) ++c.mismatches;
      continue;
    }
    double d = std::fabs(a - e);
    c.max_abs = std::max(c.max_abs, d);
    if (std::fabs(e) > 0) c.max_rel = std::max(c.max_rel, d / std::fabs(e));
    if (d > atol + rtol * std::fabs(e)) ++c.mismatches;
    diff2 += d * d;
    ref2 += e * e;
  }
  c.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  c.mismatches += c.nan_mismatch;
  return c;
}

StatusOr<std::map<std::string, Tensor>> RandomInputs(
    const Engine& engine, const std::map<std::string, std::vector<int64_t>>& shapes, uint64_t seed,
    int64_t int_high) {
  // A shape given for no input is an error, and every given shape is checked against the
  // engine before a byte is allocated for it.
  for (const auto& [name, dims] : shapes) KILN_RETURN_IF_ERROR(engine.CheckInputShape(name, dims));
  std::mt19937_64 rng(seed);
  std::map<std::string, Tensor> out;
  for (const TensorDesc& d : engine.inputs()) {
    std::vector<int64_t> dims;
    if (auto it = shapes.find(d.name); it != shapes.end()) {
      dims = it->second;
    } else if (d.profile) {
      dims = d.profile->opt;
    } else if (auto s = StaticDims(d.shape)) {
      dims = *s;
    }
    Tensor t(d.dtype, dims);
    TensorView v{t.dtype(), t.dims(), t.mutable_raw()};
    std::uniform_real_distribution<double> real(-1.0, 1.0);
    std::uniform_int_distribution<int64_t> integer(0, std::max<int64_t>(1, int_high) - 1);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      StoreFromDouble(v, i, IsFloat(d.dtype) ? real(rng) : static_cast<double>(integer(rng)));
    }
    out[d.name] = std::move(t);
  }
  return out;
}

}  // namespace kiln::app
