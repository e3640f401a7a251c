// Node-at-a-time device evaluation with device copies and kernels kept between calls.
#include "kiln/backends/device_eval.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <optional>
#include <set>
#include <utility>

#include "kiln/backends/reference.h"
#include "kiln/core/hash.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

// Integer and bool operands up to this many bytes are passed to the kernel as constants (shape
// operands: Reshape's shape, Slice's starts), keyed by their contents.
constexpr size_t kSmallConstantBytes = 512;

bool PassedAsConstant(const Node& node, size_t i, const Tensor& t) {
  if (node.input(i) && node.input(i)->is_constant()) return true;
  return !IsFloatingPoint(t.dtype()) && t.size_bytes() <= kSmallConstantBytes;
}

}  // namespace

StatusOr<std::unique_ptr<DeviceEvaluator>> DeviceEvaluator::Create(BackendKind kind,
                                                                   DeviceEvalOptions options) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(kind));
  KILN_RETURN_IF_ERROR(backend->BindThread());
  KILN_ASSIGN_OR_RETURN(DeviceHandle stream, backend->CreateStream());
  return std::unique_ptr<DeviceEvaluator>(
      new DeviceEvaluator(kind, backend, std::move(stream), options));
}

DeviceEvaluator::DeviceEvaluator(BackendKind kind, Backend* backend, DeviceHandle stream,
                                 DeviceEvalOptions options)
    : kind_(kind), backend_(backend), stream_(std::move(stream)), options_(options) {}

DeviceEvaluator::~DeviceEvaluator() { Clear(); }

void DeviceEvaluator::Clear() {
  // Kernels first: they may hold device state that refers to nothing here, but free them before
  // the buffers all the same, in the order the runtime does.
  (void)backend_->Synchronize(stream_.get());
  kernels_.clear();
  resident_.clear();
  lru_.clear();
  resident_bytes_ = 0;
  pool_.clear();
  pool_bytes_ = 0;
}

NodeEvaluator DeviceEvaluator::AsNodeEvaluator() {
  return [this](const Node& node, std::span<const Tensor* const> inputs) {
    return Evaluate(node, inputs);
  };
}

void DeviceEvaluator::MakeRoom(size_t bytes) {
  if (resident_bytes_ + bytes <= options_.max_resident_bytes) return;
  // Copies of tensors nobody else holds any more go first, then the least recently used. Entries
  // used by the node being evaluated are at the front of the list and stay.
  auto drop = [&](std::list<const void*>::iterator it) {
    auto r = resident_.find(*it);
    resident_bytes_ -= r->second.bytes;
    resident_.erase(r);
    ++stats_.evictions;
    return lru_.erase(it);
  };
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (resident_.at(*it).storage.use_count() == 1 && !pinned_.contains(*it)) {
      it = drop(it);
    } else {
      ++it;
    }
  }
  while (resident_bytes_ + bytes > options_.max_resident_bytes && !lru_.empty()) {
    auto it = std::prev(lru_.end());
    while (pinned_.contains(*it)) {
      if (it == lru_.begin()) return;
      --it;
    }
    drop(it);
  }
}

void DeviceEvaluator::Keep(const Tensor& t, DeviceBuffer device) {
  const void* host = t.raw();
  if (!host || t.size_bytes() == 0) return;
  if (auto old = resident_.find(host); old != resident_.end()) {
    // Another tensor at these bytes (a borrowed view of another length): `device` is the copy of
    // this one. The old copy may still be an operand of the node being run, so it lives until
    // the node's end.
    resident_bytes_ -= old->second.bytes;
    lru_.erase(old->second.lru);
    scratch_.push_back(std::move(old->second.device));
    resident_.erase(old);
  }
  MakeRoom(t.size_bytes());
  lru_.push_front(host);
  Resident r;
  r.storage = t.storage();
  r.host = host;
  r.bytes = t.size_bytes();
  r.device = std::move(device);
  r.lru = lru_.begin();
  resident_bytes_ += r.bytes;
  resident_.emplace(host, std::move(r));
  pinned_.insert(host);
}

StatusOr<void*> DeviceEvaluator::DeviceCopy(const Tensor& t) {
  if (t.size_bytes() == 0) return static_cast<void*>(nullptr);
  auto it = resident_.find(t.raw());
  if (it != resident_.end() && it->second.bytes == t.size_bytes() &&
      it->second.storage == t.storage()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    pinned_.insert(t.raw());
    ++stats_.resident_hits;
    return it->second.device.data();
  }
  MakeRoom(t.size_bytes());
  KILN_ASSIGN_OR_RETURN(DeviceBuffer buf, backend_->Allocate(t.size_bytes()));
  KILN_RETURN_IF_ERROR(backend_->CopyToDevice(buf.data(), t.raw(), t.size_bytes(), stream_.get()));
  ++stats_.uploads;
  stats_.upload_bytes += static_cast<int64_t>(t.size_bytes());
  void* data = buf.data();
  if (t.storage()) {
    Keep(t, std::move(buf));
  } else {
    // Not owned by a storage this can hold: used for this node only.
    scratch_.push_back(std::move(buf));
  }
  return data;
}

StatusOr<std::vector<Tensor>> DeviceEvaluator::OnHost(const Node& node,
                                                      std::span<const Tensor* const> inputs) {
  const NodeEvaluator& reference = ReferenceEvaluator();
  if (!reference) {
    return MakeError(ErrorCode::kNoTactic, "node '{}': no {} kernel for {} and no reference",
                     node.name(), ToString(kind_), node.op_type());
  }
  ++stats_.nodes_on_host;
  ++stats_.host_ops[std::string(node.op_type())];
  return reference(node, inputs);
}

StatusOr<DeviceEvaluator::CachedKernel*> DeviceEvaluator::FindKernel(
    const Node& node, std::span<const Operand> operands,
    const std::vector<ConcreteOutput>& out_info) {
  // The kernel: node, operand types and dims, and the constants it was made with.
  std::string key = fmt::format("{}|", static_cast<const void*>(&node));
  for (size_t i = 0; i < operands.size(); ++i) {
    const Operand& o = operands[i];
    if (!o.present) {
      key += "-|";
      continue;
    }
    fmt::format_to(std::back_inserter(key), "{}[{}]", ToString(o.dtype), fmt::join(o.dims, ","));
    if (o.as_constant) {
      if (o.host->size_bytes() <= kSmallConstantBytes) {
        fmt::format_to(std::back_inserter(key), "={:x}", Hash64(o.host->bytes()));
      } else {
        fmt::format_to(std::back_inserter(key), "@{}", o.host->raw());
      }
    }
    key += '|';
  }
  if (auto found = kernels_.find(key); found != kernels_.end()) {
    // A constant keyed by address is held by the entry, so the address still names those bytes.
    ++stats_.kernel_cache_hits;
    return &found->second;
  }
  if (kernels_.size() >= options_.max_kernels) kernels_.clear();
  CachedKernel entry;
  entry.request = std::make_unique<KernelRequest>();
  KernelRequest& request = *entry.request;
  request.node = &node;
  request.max_tactics = 1;
  entry.constant_copies.reserve(operands.size());
  for (const Operand& o : operands) {
    OperandDesc d;
    if (o.present) {
      d.dtype = o.dtype;
      d.shape = MakeShape(o.dims);
      d.max_dims = o.dims;
      if (o.as_constant) {
        entry.constant_copies.push_back(*o.host);  // shares the storage
        entry.constants.push_back(o.host->storage());
        d.constant = &entry.constant_copies.back();
      }
    }
    request.inputs.push_back(std::move(d));
  }
  for (const ConcreteOutput& out : out_info) {
    request.outputs.push_back({out.dtype, out.shape, out.dims, nullptr});
  }
  for (const KernelProvider* p : KernelRegistry::Get().Providers(kind_, node)) {
    if (p->runs_on_host()) continue;
    auto tactics = p->Tactics(request);
    if (tactics.empty()) continue;
    auto kernel = p->Create(request, tactics.front());
    if (!kernel.ok()) continue;
    entry.kernel = std::move(*kernel);
    break;
  }
  if (!entry.kernel) return static_cast<CachedKernel*>(nullptr);
  ++stats_.kernels_created;
  return &kernels_.emplace(key, std::move(entry)).first->second;
}

Status DeviceEvaluator::RunKernel(const Node& node, CachedKernel& cached,
                                  std::span<const TensorView> in_views,
                                  std::span<const TensorView> out_views) {
  if (!cached.prepared) {
    KILN_ASSIGN_OR_RETURN(cached.workspace_bytes, cached.kernel->Prepare(in_views, out_views));
    if (cached.workspace_bytes) {
      KILN_ASSIGN_OR_RETURN(cached.workspace, backend_->Allocate(cached.workspace_bytes));
    }
    cached.prepared = true;
  }
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = cached.workspace.data();
  args.workspace_bytes = cached.workspace_bytes;
  args.stream = stream_.get();
  KILN_RETURN_IF_ERROR_CTX(cached.kernel->Run(args), "running node '{}' ({}) on {}", node.name(),
                           node.op_type(), ToString(kind_));
  ++stats_.nodes_on_device;
  return OkStatus();
}

StatusOr<std::vector<Tensor>> DeviceEvaluator::Evaluate(const Node& node,
                                                        std::span<const Tensor* const> inputs) {
  KILN_RETURN_IF_ERROR(backend_->BindThread());
  // Shapes as the reference computes them: every operand's values are known here.
  KILN_ASSIGN_OR_RETURN(std::vector<ConcreteOutput> out_info, InferNodeOnTensors(node, inputs));
  std::vector<Operand> operands(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    operands[i] = {true, inputs[i]->dtype(), inputs[i]->dims(), inputs[i],
                   PassedAsConstant(node, i, *inputs[i])};
  }
  KILN_ASSIGN_OR_RETURN(CachedKernel * cached, FindKernel(node, operands, out_info));
  if (!cached) return OnHost(node, inputs);

  pinned_.clear();
  scratch_.clear();
  std::vector<TensorView> in_views(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    KILN_ASSIGN_OR_RETURN(void* data, DeviceCopy(*inputs[i]));
    in_views[i] = {inputs[i]->dtype(), inputs[i]->dims(), data};
  }
  std::vector<Tensor> outputs;
  std::vector<DeviceBuffer> out_bufs;
  std::vector<TensorView> out_views;
  for (size_t i = 0; i < out_info.size(); ++i) {
    outputs.push_back(Tensor::ForOverwrite(out_info[i].dtype, out_info[i].dims));
    const size_t bytes = outputs.back().size_bytes();
    MakeRoom(bytes);
    DeviceBuffer buf;
    if (bytes) {
      KILN_ASSIGN_OR_RETURN(buf, backend_->Allocate(bytes));
    }
    out_views.push_back({out_info[i].dtype, out_info[i].dims, buf.data()});
    out_bufs.push_back(std::move(buf));
  }
  KILN_RETURN_IF_ERROR(RunKernel(node, *cached, in_views, out_views));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::vector<int64_t>* got = cached->kernel->RunOutputDims(i);
    if (got && *got != outputs[i].dims()) {
      Tensor actual = Tensor::ForOverwrite(outputs[i].dtype(), *got);
      if (actual.size_bytes() > outputs[i].size_bytes()) {
        return MakeError(ErrorCode::kInternal, "node '{}': output {} reported dims past its bound",
                         node.name(), i);
      }
      outputs[i] = std::move(actual);
    }
    if (outputs[i].size_bytes() == 0) continue;
    KILN_RETURN_IF_ERROR(backend_->CopyToHost(outputs[i].mutable_raw(), out_bufs[i].data(),
                                              outputs[i].size_bytes(), stream_.get()));
    ++stats_.downloads;
    stats_.download_bytes += static_cast<int64_t>(outputs[i].size_bytes());
  }
  KILN_RETURN_IF_ERROR(backend_->Synchronize(stream_.get()));
  scratch_.clear();
  // The outputs' device copies stay for the nodes that read them next.
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].size_bytes()) Keep(outputs[i], std::move(out_bufs[i]));
  }
  pinned_.clear();
  return outputs;
}

GraphStatsEvaluator DeviceEvaluator::AsGraphStatsEvaluator() {
  return [this](const Graph& graph, const std::map<std::string, Tensor>& feed,
                const ValueStatsRequest& request) { return EvaluateStats(graph, feed, request); };
}

StatusOr<DeviceBuffer> DeviceEvaluator::TakeBuffer(size_t bytes) {
  if (bytes == 0) return DeviceBuffer();
  if (auto it = pool_.find(bytes); it != pool_.end()) {
    DeviceBuffer buf = std::move(it->second);
    pool_.erase(it);
    pool_bytes_ -= bytes;
    ++stats_.pool_hits;
    return buf;
  }
  MakeRoom(bytes);
  auto made = backend_->Allocate(bytes);
  if (!made.ok() && !pool_.empty()) {
    // Out of device memory, perhaps for what the pool holds: free it and try once more.
    pool_.clear();
    pool_bytes_ = 0;
    made = backend_->Allocate(bytes);
  }
  return made;
}

void DeviceEvaluator::GiveBack(DeviceBuffer buf) {
  const size_t bytes = buf.size();
  if (!buf.data() || bytes == 0) return;
  // Bounded like the resident copies; past it the buffer is freed.
  if (pool_bytes_ + bytes > options_.max_resident_bytes) return;
  pool_bytes_ += bytes;
  pool_.emplace(bytes, std::move(buf));
}

// One value of an EvaluateStats walk: computed on the device (`buf`), on the host (`host`, with a
// resident device copy made when a device kernel reads it), or both (downloaded).
struct DeviceEvaluator::WalkValue {
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> dims;
  DeviceBuffer buf;
  std::optional<Tensor> host;
  int64_t readers = 0;
  size_t bytes() const { return ByteSize(NumElements(dims), dtype); }
};

StatusOr<const Tensor*> DeviceEvaluator::HostOf(WalkValue& v) {
  if (v.host) return &*v.host;
  Tensor t = Tensor::ForOverwrite(v.dtype, v.dims);
  if (t.size_bytes()) {
    KILN_RETURN_IF_ERROR(
        backend_->CopyToHost(t.mutable_raw(), v.buf.data(), t.size_bytes(), stream_.get()));
    KILN_RETURN_IF_ERROR(backend_->Synchronize(stream_.get()));
    ++stats_.downloads;
    stats_.download_bytes += static_cast<int64_t>(t.size_bytes());
  }
  v.host = std::move(t);
  return &*v.host;
}

StatusOr<void*> DeviceEvaluator::DeviceOf(WalkValue& v) {
  if (v.buf.data() || !v.host) return v.buf.data();
  // A host value (a graph input, a host node's output): its resident copy, uploaded once and
  // pinned for the node being run (looked up again for every node: it may be evicted between).
  return DeviceCopy(*v.host);
}

StatusOr<ValueStats> DeviceEvaluator::EvaluateStats(const Graph& graph,
                                                    const std::map<std::string, Tensor>& feed,
                                                    const ValueStatsRequest& request) {
  KILN_RETURN_IF_ERROR(backend_->BindThread());
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  std::unordered_map<const Value*, WalkValue> values;
  for (const Node* node : order) {
    for (const Value* v : node->inputs()) {
      if (v && !v->constant()) ++values[v].readers;
    }
  }
  ValueStats stats;
  // Device-side accumulators: one absmax slot per requested name, `bins` counters per histogram.
  std::map<std::string, size_t> absmax_slot, hist_slot;
  for (const std::string& name : request.absmax) absmax_slot.emplace(name, absmax_slot.size());
  for (const auto& [name, range] : request.histograms) hist_slot.emplace(name, hist_slot.size());
  const size_t bins = static_cast<size_t>(std::max(request.bins, 1));
  std::vector<uint32_t> absmax_bits(absmax_slot.size(), 0);
  std::vector<uint64_t> hist_counts(hist_slot.size() * bins, 0);
  DeviceBuffer absmax_dev, hist_dev;
  std::set<std::string> on_device_absmax, on_device_hist;
  if (!absmax_bits.empty()) {
    KILN_ASSIGN_OR_RETURN(absmax_dev, backend_->Allocate(absmax_bits.size() * sizeof(uint32_t)));
    KILN_RETURN_IF_ERROR(backend_->CopyToDevice(absmax_dev.data(), absmax_bits.data(),
                                                absmax_bits.size() * sizeof(uint32_t),
                                                stream_.get()));
  }
  if (!hist_counts.empty()) {
    KILN_ASSIGN_OR_RETURN(hist_dev, backend_->Allocate(hist_counts.size() * sizeof(uint64_t)));
    KILN_RETURN_IF_ERROR(backend_->CopyToDevice(
        hist_dev.data(), hist_counts.data(), hist_counts.size() * sizeof(uint64_t), stream_.get()));
  }

  // A value as it is computed: reduced on the device where it was computed and the backend can,
  // else on the host.
  auto observe = [&](const Value& value, WalkValue& v) -> Status {
    const std::string& name = value.name();
    const int64_t n = v.host ? 0 : NumElements(v.dims);
    if (auto a = absmax_slot.find(name); a != absmax_slot.end() && IsFloat(v.dtype)) {
      bool done = false;
      if (n > 0) {
        auto* slot = static_cast<uint32_t*>(absmax_dev.data()) + a->second;
        KILN_ASSIGN_OR_RETURN(done, backend_->AccumulateAbsStats(v.dtype, v.buf.data(), n, slot,
                                                                 nullptr, 0, 0, stream_.get()));
      }
      if (done) {
        on_device_absmax.insert(name);
      } else {
        KILN_ASSIGN_OR_RETURN(const Tensor* t, HostOf(v));
        AccumulateAbsMax(*t, &stats.absmax[name]);
      }
    }
    if (auto h = request.histograms.find(name); h != request.histograms.end() && IsFloat(v.dtype)) {
      bool done = false;
      if (!(h->second > 0)) {
        // The host's rule for an empty range, without fetching the values: all in bin 0.
        std::vector<double>& counts = stats.histograms[name];
        counts.assign(bins, 0.0);
        counts[0] = static_cast<double>(NumElements(v.dims));
        done = true;
      } else if (n > 0) {
        auto* counts = static_cast<uint64_t*>(hist_dev.data()) + hist_slot.at(name) * bins;
        KILN_ASSIGN_OR_RETURN(
            done, backend_->AccumulateAbsStats(v.dtype, v.buf.data(), n, nullptr, counts,
                                               static_cast<int>(bins), h->second, stream_.get()));
      }
      if (done) {
        if (h->second > 0) on_device_hist.insert(name);
      } else {
        KILN_ASSIGN_OR_RETURN(const Tensor* t, HostOf(v));
        std::vector<double>& counts = stats.histograms[name];
        counts.assign(bins, 0.0);
        AccumulateAbsHistogram(*t, h->second, counts);
      }
    }
    if (request.keep_all || request.keep.contains(name)) {
      KILN_ASSIGN_OR_RETURN(const Tensor* t, HostOf(v));
      stats.kept[name] = *t;
    }
    return OkStatus();
  };
  auto release = [&](const Value* value) {
    auto it = values.find(value);
    if (it == values.end()) return;
    GiveBack(std::move(it->second.buf));
    values.erase(it);
  };

  pinned_.clear();
  scratch_.clear();
  for (const Value* in : graph.inputs()) {
    auto it = feed.find(in->name());
    if (it == feed.end()) {
      return MakeError(ErrorCode::kInputCountMismatch, "no value given for graph input '{}'",
                       in->name());
    }
    WalkValue& v = values[in];
    v.dtype = it->second.dtype();
    v.dims = it->second.dims();
    v.host = it->second;  // shares the storage: uploaded once, and kept resident between calls
    KILN_RETURN_IF_ERROR(observe(*in, v));
    if (v.readers == 0) release(in);
  }

  std::vector<Operand> operands;
  std::vector<ValueInfo> infos;
  std::vector<const ValueInfo*> info_ptrs;
  std::vector<const Tensor*> host_ins;
  for (const Node* node : order) {
    const size_t n_in = node->num_inputs();
    pinned_.clear();
    // Which operands the node needs on the host: small integer ones (shape operands, passed to
    // kernels as constants), the rest only when inference cannot do without their values.
    std::vector<WalkValue*> walk(n_in, nullptr);
    std::vector<const Tensor*> known(n_in, nullptr);
    for (size_t i = 0; i < n_in; ++i) {
      const Value* v = node->input(i);
      if (!v) continue;
      if (v->constant()) {
        known[i] = v->constant();
        continue;
      }
      auto it = values.find(v);
      if (it == values.end()) {
        return MakeError(ErrorCode::kUndefinedValue, "value '{}' read by '{}' was never computed",
                         v->name(), node->name());
      }
      walk[i] = &it->second;
      const WalkValue& w = it->second;
      if (w.host || (!IsFloatingPoint(w.dtype) && w.bytes() <= kSmallConstantBytes)) {
        KILN_ASSIGN_OR_RETURN(known[i], HostOf(it->second));
      }
    }
    // A layer the sensitivity runs on quantized operands: its weights replaced here, its input
    // quantized just before it runs.
    const ValueStatsRequest::Override* override = nullptr;
    if (auto o = request.overrides.find(node); o != request.overrides.end()) override = &o->second;
    const bool e4m3 = override && !(override->int8_amax > 0) && override->fp8_amax > 0;
    const float q_amax = !override ? 0.f : e4m3 ? override->fp8_amax : override->int8_amax;
    const bool quantize_input = q_amax > 0 && n_in > 0 && node->input(0);
    auto fake_quantize = [&](const Tensor& x) {
      return e4m3 ? FakeQuantizeE4M3(x, q_amax) : FakeQuantizeInt8(x, q_amax);
    };
    if (override && override->input1 && n_in > 1) {
      known[1] = override->input1;
      walk[1] = nullptr;
    }
    auto infer = [&]() -> StatusOr<std::vector<ConcreteOutput>> {
      infos.assign(n_in, ValueInfo{});
      info_ptrs.assign(n_in, nullptr);
      for (size_t i = 0; i < n_in; ++i) {
        if (!node->input(i)) continue;
        infos[i].dtype = known[i] ? known[i]->dtype() : walk[i]->dtype;
        infos[i].shape = MakeShape(known[i] ? known[i]->dims() : walk[i]->dims);
        infos[i].constant = known[i];
        info_ptrs[i] = &infos[i];
      }
      return InferNodeOnOperands(*node, info_ptrs);
    };
    auto out_info = infer();
    if (!out_info.ok()) {
      // A shape that follows from a device-only operand's values: fetch them and ask again. (A
      // graph that passed static inference reads only small integer operands' values, which are
      // fetched above; this keeps any other case correct, at the cost of a download.)
      for (size_t i = 0; i < n_in; ++i) {
        if (walk[i] && !known[i]) {
          KILN_ASSIGN_OR_RETURN(known[i], HostOf(*walk[i]));
        }
      }
      out_info = infer();
    }
    if (!out_info.ok()) return std::move(out_info).status();

    operands.assign(n_in, Operand{});
    for (size_t i = 0; i < n_in; ++i) {
      if (!node->input(i)) continue;
      Operand& o = operands[i];
      o.present = true;
      o.dtype = infos[i].dtype;
      o.dims = known[i] ? known[i]->dims() : walk[i]->dims;
      o.host = known[i];
      o.as_constant = known[i] && PassedAsConstant(*node, i, *known[i]);
    }
    KILN_ASSIGN_OR_RETURN(CachedKernel * cached, FindKernel(*node, operands, *out_info));

    std::vector<WalkValue> outs(out_info->size());
    if (!cached) {
      // No device kernel: the reference runs it on the operands' host copies.
      host_ins.assign(n_in, nullptr);
      for (size_t i = 0; i < n_in; ++i) {
        if (known[i]) {
          host_ins[i] = known[i];
        } else if (walk[i]) {
          KILN_ASSIGN_OR_RETURN(host_ins[i], HostOf(*walk[i]));
        }
      }
      Tensor quantized;
      if (quantize_input) {
        quantized = fake_quantize(*host_ins[0]);
        host_ins[0] = &quantized;
      }
      KILN_ASSIGN_OR_RETURN(std::vector<Tensor> results, OnHost(*node, host_ins));
      for (size_t i = 0; i < outs.size() && i < results.size(); ++i) {
        outs[i].dtype = results[i].dtype();
        outs[i].dims = results[i].dims();
        outs[i].host = std::move(results[i]);
      }
    } else {
      std::vector<TensorView> in_views(n_in);
      for (size_t i = 0; i < n_in; ++i) {
        if (!node->input(i)) continue;
        void* data = nullptr;
        if (walk[i]) {
          KILN_ASSIGN_OR_RETURN(data, DeviceOf(*walk[i]));
        } else {
          KILN_ASSIGN_OR_RETURN(data, DeviceCopy(*known[i]));
        }
        in_views[i] = {operands[i].dtype, operands[i].dims, data};
      }
      DeviceBuffer quantized;
      if (quantize_input) {
        KILN_ASSIGN_OR_RETURN(quantized, TakeBuffer(in_views[0].size_bytes()));
        KILN_ASSIGN_OR_RETURN(
            bool done,
            backend_->FakeQuantize(e4m3, in_views[0].dtype, in_views[0].data, quantized.data(),
                                   in_views[0].num_elements(), q_amax, stream_.get()));
        if (!done) {
          const Tensor* x = known[0];
          if (!x) {
            KILN_ASSIGN_OR_RETURN(x, HostOf(*walk[0]));
          }
          const Tensor q = fake_quantize(*x);
          KILN_RETURN_IF_ERROR(
              backend_->CopyToDevice(quantized.data(), q.raw(), q.size_bytes(), stream_.get()));
          KILN_RETURN_IF_ERROR(backend_->Synchronize(stream_.get()));
        }
        in_views[0].data = quantized.data();
      }
      std::vector<TensorView> out_views;
      for (size_t i = 0; i < outs.size(); ++i) {
        outs[i].dtype = (*out_info)[i].dtype;
        outs[i].dims = (*out_info)[i].dims;
        KILN_ASSIGN_OR_RETURN(outs[i].buf, TakeBuffer(outs[i].bytes()));
        out_views.push_back({outs[i].dtype, outs[i].dims, outs[i].buf.data()});
      }
      KILN_RETURN_IF_ERROR(RunKernel(*node, *cached, in_views, out_views));
      GiveBack(std::move(quantized));  // reused after the kernel: the stream orders them
      for (size_t i = 0; i < outs.size(); ++i) {
        const std::vector<int64_t>* got = cached->kernel->RunOutputDims(i);
        if (!got || *got == outs[i].dims) continue;
        if (NumElements(*got) > NumElements(outs[i].dims)) {
          return MakeError(ErrorCode::kInternal,
                           "node '{}': output {} reported dims past its bound", node->name(), i);
        }
        outs[i].dims = *got;  // the buffer keeps the bound's size, and goes back to the pool so
      }
    }
    for (size_t i = 0; i < outs.size() && i < node->num_outputs(); ++i) {
      const Value* v = node->output(i);
      if (!v) continue;
      WalkValue& w = values[v];
      const int64_t readers = w.readers;
      w = std::move(outs[i]);
      w.readers = readers;
      KILN_RETURN_IF_ERROR(observe(*v, w));
      if (w.readers == 0) release(v);
    }
    for (const Value* v : node->inputs()) {
      if (!v || v->constant()) continue;
      auto it = values.find(v);
      if (it != values.end() && --it->second.readers == 0) release(v);
    }
  }

  // The reductions' numbers: one download each, then the host's types.
  if (!absmax_bits.empty()) {
    KILN_RETURN_IF_ERROR(backend_->CopyToHost(absmax_bits.data(), absmax_dev.data(),
                                              absmax_bits.size() * sizeof(uint32_t),
                                              stream_.get()));
  }
  if (!hist_counts.empty()) {
    KILN_RETURN_IF_ERROR(backend_->CopyToHost(
        hist_counts.data(), hist_dev.data(), hist_counts.size() * sizeof(uint64_t), stream_.get()));
  }
  KILN_RETURN_IF_ERROR(backend_->Synchronize(stream_.get()));
  scratch_.clear();
  pinned_.clear();
  for (const std::string& name : on_device_absmax) {
    const uint32_t bits = absmax_bits[absmax_slot.at(name)];
    float f = 0;
    std::memcpy(&f, &bits, sizeof(f));
    double& m = stats.absmax[name];
    m = std::max(m, static_cast<double>(f));
  }
  for (const std::string& name : on_device_hist) {
    const uint64_t* c = hist_counts.data() + hist_slot.at(name) * bins;
    stats.histograms[name].assign(c, c + bins);
  }
  return stats;
}

}  // namespace kiln
