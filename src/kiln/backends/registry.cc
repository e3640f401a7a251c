// The kernel-provider registry and the backend table.
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>

#include "kiln/backends/backend.h"
#include "kiln/ops/op_table.h"

namespace kiln {

std::string_view ToString(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "?";
}

KernelRegistry& KernelRegistry::Get() {
  static KernelRegistry registry;
  return registry;
}

void KernelRegistry::Register(std::unique_ptr<KernelProvider> provider) {
  std::lock_guard lock(index_mu_);
  providers_.push_back(std::move(provider));
  index_built_ = false;
}

void KernelRegistry::BuildIndexLocked() const {
  if (index_built_) return;
  index_.clear();
  undeclared_.clear();
  for (const auto& p : providers_) {
    std::optional<OpType> op = LookupOpType(p->op_type());
    if (!op) {
      undeclared_.push_back(p.get());
      continue;
    }
    auto& by_op = index_[p->backend()];
    by_op.resize(static_cast<size_t>(OpType::kNumOps));
    by_op[static_cast<size_t>(*op)].push_back(p.get());
  }
  // Registration order across files is unspecified; sort by id for determinism.
  for (auto& [backend_kind, by_op] : index_) {
    for (auto& list : by_op) {
      std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->id() < b->id(); });
    }
  }
  index_built_ = true;
}

std::vector<const KernelProvider*> KernelRegistry::Providers(BackendKind backend, OpType op) const {
  std::lock_guard lock(index_mu_);
  BuildIndexLocked();
  auto by_backend = index_.find(backend);
  const size_t i = static_cast<size_t>(op);
  if (by_backend == index_.end() || i >= by_backend->second.size()) return {};
  return by_backend->second[i];
}

std::vector<const KernelProvider*> KernelRegistry::Providers(BackendKind backend,
                                                             std::string_view op_type) const {
  std::optional<OpType> op = LookupOpType(op_type);
  return op ? Providers(backend, *op) : std::vector<const KernelProvider*>();
}

std::vector<const KernelProvider*> KernelRegistry::Undeclared() const {
  std::lock_guard lock(index_mu_);
  BuildIndexLocked();
  return undeclared_;
}

std::string NodeLayout(const Node& node) {
  std::string layout = node.attrs().GetString("kiln_layout", "");
  return layout == "NCHW" ? std::string() : layout;
}

std::vector<const KernelProvider*> KernelRegistry::Providers(BackendKind backend,
                                                             const Node& node) const {
  std::vector<const KernelProvider*> out = Providers(backend, OpTypeOf(node));
  std::string layout = NodeLayout(node);
  std::erase_if(out, [&](const KernelProvider* p) { return !p->SupportsLayout(layout); });
  return out;
}

std::vector<const KernelProvider*> KernelRegistry::NativeProviders(BackendKind backend,
                                                                   OpType op) const {
  std::vector<const KernelProvider*> out = Providers(backend, op);
  std::erase_if(out, [](const KernelProvider* p) { return p->runs_on_host(); });
  return out;
}

const KernelProvider* KernelRegistry::Find(BackendKind backend,
                                           std::string_view provider_id) const {
  for (const auto& p : providers_) {
    if (p->backend() == backend && p->id() == provider_id) return p.get();
  }
  return nullptr;
}

std::vector<const KernelProvider*> KernelRegistry::All() const {
  std::vector<const KernelProvider*> out;
  for (const auto& p : providers_) out.push_back(p.get());
  return out;
}

namespace {
struct BackendTable {
  std::mutex mu;
  std::map<BackendKind, std::function<StatusOr<std::unique_ptr<Backend>>()>> factories;
  std::map<BackendKind, std::unique_ptr<Backend>> instances;
  std::map<BackendKind, Status> failures;
};
BackendTable& Table() {
  static BackendTable* t = new BackendTable();
  return *t;
}
}  // namespace

void RegisterBackendFactory(BackendKind kind,
                            std::function<StatusOr<std::unique_ptr<Backend>>()> factory) {
  BackendTable& t = Table();
  std::lock_guard lock(t.mu);
  t.factories[kind] = std::move(factory);
}

StatusOr<Backend*> GetBackend(BackendKind kind) {
  BackendTable& t = Table();
  std::lock_guard lock(t.mu);
  if (auto it = t.instances.find(kind); it != t.instances.end()) return it->second.get();
  if (auto it = t.failures.find(kind); it != t.failures.end()) return it->second;
  auto f = t.factories.find(kind);
  if (f == t.factories.end()) {
    return MakeError(ErrorCode::kBackendUnavailable, "backend '{}' is not built into this kiln",
                     ToString(kind));
  }
  auto made = f->second();
  if (!made.ok()) {
    t.failures[kind] = made.status();
    return made.status();
  }
  Backend* raw = made->get();
  t.instances[kind] = std::move(*made);
  return raw;
}

BackendKind BestAvailableBackend() {
  return GetBackend(BackendKind::kCuda).ok() ? BackendKind::kCuda : BackendKind::kCpu;
}

}  // namespace kiln
