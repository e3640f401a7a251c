// Node-at-a-time device evaluation with device copies and kernels kept between calls.
#include "kiln/backends/device_eval.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iterator>
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

StatusOr<std::vector<Tensor>> DeviceEvaluator::Evaluate(const Node& node,
                                                        std::span<const Tensor* const> inputs) {
  KILN_RETURN_IF_ERROR(backend_->BindThread());
  // Shapes as the reference computes them: every operand's values are known here.
  KILN_ASSIGN_OR_RETURN(std::vector<ConcreteOutput> out_info, InferNodeOnTensors(node, inputs));

  // The kernel: node, operand types and dims, and the constants it was made with.
  std::string key = fmt::format("{}|", static_cast<const void*>(&node));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor* t = inputs[i];
    if (!t) {
      key += "-|";
      continue;
    }
    fmt::format_to(std::back_inserter(key), "{}[{}]", ToString(t->dtype()),
                   fmt::join(t->dims(), ","));
    if (PassedAsConstant(node, i, *t)) {
      if (t->size_bytes() <= kSmallConstantBytes) {
        fmt::format_to(std::back_inserter(key), "={:x}", Hash64(t->bytes()));
      } else {
        fmt::format_to(std::back_inserter(key), "@{}", t->raw());
      }
    }
    key += '|';
  }
  auto found = kernels_.find(key);
  CachedKernel* cached = nullptr;
  if (found != kernels_.end()) {
    // A constant keyed by address is held by the entry, so the address still names those bytes.
    cached = &found->second;
    ++stats_.kernel_cache_hits;
  } else {
    if (kernels_.size() >= options_.max_kernels) kernels_.clear();
    CachedKernel entry;
    entry.request = std::make_unique<KernelRequest>();
    KernelRequest& request = *entry.request;
    request.node = &node;
    request.max_tactics = 1;
    entry.constant_copies.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      OperandDesc d;
      if (inputs[i]) {
        d.dtype = inputs[i]->dtype();
        d.shape = MakeShape(inputs[i]->dims());
        d.max_dims = inputs[i]->dims();
        if (PassedAsConstant(node, i, *inputs[i])) {
          entry.constant_copies.push_back(*inputs[i]);  // shares the storage
          entry.constants.push_back(inputs[i]->storage());
          d.constant = &entry.constant_copies.back();
        }
      }
      request.inputs.push_back(std::move(d));
    }
    for (size_t i = 0; i < out_info.size(); ++i) {
      request.outputs.push_back({out_info[i].dtype, out_info[i].shape, out_info[i].dims, nullptr});
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
    if (!entry.kernel) return OnHost(node, inputs);
    ++stats_.kernels_created;
    cached = &kernels_.emplace(key, std::move(entry)).first->second;
  }

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
  if (found == kernels_.end()) {
    KILN_ASSIGN_OR_RETURN(cached->workspace_bytes, cached->kernel->Prepare(in_views, out_views));
    if (cached->workspace_bytes) {
      KILN_ASSIGN_OR_RETURN(cached->workspace, backend_->Allocate(cached->workspace_bytes));
    }
  }
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = cached->workspace.data();
  args.workspace_bytes = cached->workspace_bytes;
  args.stream = stream_.get();
  KILN_RETURN_IF_ERROR_CTX(cached->kernel->Run(args), "running node '{}' ({}) on {}", node.name(),
                           node.op_type(), ToString(kind_));
  ++stats_.nodes_on_device;
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

}  // namespace kiln
