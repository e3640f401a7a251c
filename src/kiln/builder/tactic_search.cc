// The anytime search. Order of work: (1) heuristic tactic for all layers, (2) timing-cache hits,
// (3) timing, biggest expected gain first, stopping at the deadline with the best choices so far.
#include "kiln/builder/tactic_search.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>

#include "kiln/core/logging.h"
#include "kiln/ir/sizes.h"

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;

bool Expired(const TacticSearchOptions& o) { return o.deadline && Clock::now() >= *o.deadline; }

int64_t Elements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n = SatMul(n, std::max<int64_t>(d, 1));
  return n;
}

// Work estimate: output elements times the elements of the largest constant operand (a proxy
// for multiply-accumulates of conv/gemm layers), so big layers are timed first.
double ExpectedWork(const LayerSearch& l) {
  double out = 0;
  for (const auto& d : l.opt_out) out += static_cast<double>(Elements(d));
  double weights = 1;
  for (const auto& op : l.request.inputs) {
    if (op.constant) weights = std::max(weights, static_cast<double>(op.constant->num_elements()));
  }
  return out * std::sqrt(weights);
}

void FillRandom(Tensor& t, std::mt19937& rng) {
  TensorView v{t.dtype(), t.dims(), t.mutable_raw()};
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    StoreFromDouble(v, i, IsFloat(t.dtype()) ? dist(rng) : 0.0);
  }
}
}  // namespace

StatusOr<TacticTiming> TimeTactic(Backend& backend, const LayerSearch& layer,
                                  const TacticCandidate& c, const TacticSearchOptions& options) {
  const auto setup_start = Clock::now();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel,
                        c.provider->Create(layer.request, c.tactic));
  std::mt19937 rng(1234);
  std::vector<Tensor> host_inputs, host_outputs;
  std::vector<DeviceBuffer> buffers;
  std::vector<TensorView> ins, outs;
  const bool host = backend.host_accessible();
  auto place = [&](const Tensor& t) -> StatusOr<void*> {
    if (host) return const_cast<void*>(t.raw());
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend.Allocate(std::max<size_t>(t.size_bytes(), 1)));
    KILN_RETURN_IF_ERROR(backend.CopyToDevice(b.data(), t.raw(), t.size_bytes(), nullptr));
    void* p = b.data();
    buffers.push_back(std::move(b));
    return p;
  };
  host_inputs.reserve(layer.request.inputs.size());
  for (size_t i = 0; i < layer.request.inputs.size(); ++i) {
    const OperandDesc& d = layer.request.inputs[i];
    if (d.dtype == DataType::kUndefined) {
      host_inputs.emplace_back();
      continue;
    }
    if (d.constant) {
      host_inputs.push_back(*d.constant);
    } else {
      host_inputs.emplace_back(d.dtype, layer.opt_in[i]);
      FillRandom(host_inputs.back(), rng);
    }
  }
  for (size_t i = 0; i < layer.request.outputs.size(); ++i) {
    host_outputs.emplace_back(layer.request.outputs[i].dtype, layer.opt_out[i]);
  }
  for (const Tensor& t : host_inputs) {
    if (t.empty()) {
      ins.push_back({});
      continue;
    }
    KILN_ASSIGN_OR_RETURN(void* p, place(t));
    ins.push_back({t.dtype(), t.dims(), p});
  }
  for (Tensor& t : host_outputs) {
    KILN_ASSIGN_OR_RETURN(void* p, place(t));
    outs.push_back({t.dtype(), t.dims(), p});
  }
  KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel->Prepare(ins, outs));
  DeviceBuffer ws;
  if (ws_bytes) {
    KILN_ASSIGN_OR_RETURN(ws, backend.Allocate(ws_bytes));
  }
  KernelRunArgs args;
  args.inputs = ins;
  args.outputs = outs;
  args.workspace = ws.data();
  args.workspace_bytes = ws_bytes;
  // At the deadline nothing more is run: a candidate whose set-up (kernel creation, weight
  // packing, inputs) used up the time is left untimed (runs == 0), and one whose warm-up run
  // crossed the deadline is judged by that run, so what runs past the deadline is at most one
  // set-up and one launch.
  const auto run_start = Clock::now();
  const double setup_seconds = std::chrono::duration<double>(run_start - setup_start).count();
  if (Expired(options)) {
    TacticTiming untimed;
    untimed.setup_seconds = setup_seconds;
    return untimed;
  }
  std::vector<double> times;
  double total = 0;
  for (int i = 0; i < options.warmup_runs; ++i) {
    auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(kernel->Run(args));
    KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
    if (Expired(options)) {
      times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      total = times.back();
      break;
    }
  }
  while (times.empty() ||
         (static_cast<int>(times.size()) < options.max_runs && !Expired(options))) {
    auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(kernel->Run(args));
    KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    times.push_back(ms);
    total += ms;
    if (options.max_kernel_time_ms && ms > *options.max_kernel_time_ms) break;  // rejected anyway
    if (static_cast<int>(times.size()) >= options.min_runs && total >= options.min_total_ms) break;
  }
  TacticTiming t;
  t.setup_seconds = setup_seconds;
  t.run_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  t.runs = static_cast<int>(times.size());
  t.max_ms = *std::max_element(times.begin(), times.end());
  std::sort(times.begin(), times.end());
  t.median_ms = times[times.size() / 2];
  return t;
}

namespace {
// The report's per-signature breakdown, most seconds first, and its totals.
class SignatureClock {
 public:
  explicit SignatureClock(std::vector<LayerSearch>& layers) {
    for (const LayerSearch& l : layers) {
      auto [it, inserted] = index_.try_emplace(l.signature, times_.size());
      if (inserted) {
        times_.push_back({l.signature, l.node->op_type(), l.node->name(), 0,
                          static_cast<int64_t>(l.candidates.size())});
      }
      SignatureTime& t = times_[it->second];
      ++t.layers;
      t.generate_seconds += l.generate_seconds;
    }
  }
  // A candidate timed (counted) or only set up before the deadline stopped it (not counted).
  void Timed(const LayerSearch& l, const TacticTiming& timing, bool counted = true) {
    SignatureTime& t = times_[index_.at(l.signature)];
    if (counted) ++t.timed;
    t.setup_seconds += timing.setup_seconds;
    t.timing_seconds += timing.run_seconds;
  }
  void Failed(const LayerSearch& l) { ++times_[index_.at(l.signature)].timed; }
  void Into(BuildTimeBreakdown& out) {
    std::stable_sort(times_.begin(), times_.end(),
                     [](const SignatureTime& a, const SignatureTime& b) {
                       return a.total_seconds() > b.total_seconds();
                     });
    for (const SignatureTime& t : times_) {
      out.generate_seconds += t.generate_seconds;
      out.setup_seconds += t.setup_seconds;
      out.timing_seconds += t.timing_seconds;
    }
    out.signatures = std::move(times_);
  }

 private:
  std::unordered_map<std::string, size_t> index_;
  std::vector<SignatureTime> times_;
};
}  // namespace

Status SearchTactics(Backend& backend, std::vector<LayerSearch>& layers,
                     const TacticSearchOptions& options, BuildReport* report) {
  SignatureClock clock(layers);
  struct Publish {  // on every return, errors included: the breakdown says where the time went
    SignatureClock& clock;
    BuildReport* report;
    ~Publish() { clock.Into(report->time_breakdown); }
  } publish{clock, report};
  // Phase 1 happened when candidates were listed: chosen = 0 is the heuristic choice. Candidates
  // that break the workspace bound are dropped here; a layer left with none cannot be built.
  for (LayerSearch& l : layers) {
    if (options.max_workspace_bytes) {
      std::erase_if(l.candidates, [&](const TacticCandidate& c) {
        return static_cast<int64_t>(c.tactic.workspace_bytes) > *options.max_workspace_bytes;
      });
      if (l.candidates.empty()) {
        return MakeError(ErrorCode::kMemoryBudgetExceeded,
                         "layer '{}' ({}) has no tactic whose workspace fits the {} bytes the "
                         "memory budget leaves",
                         l.node->name(), l.node->op_type(), *options.max_workspace_bytes);
      }
    }
    l.chosen = 0;
  }
  // Phase 2: timing-cache hits.
  std::vector<LayerSearch*> to_time;
  for (LayerSearch& l : layers) {
    if (l.candidates.size() < 2 && !options.max_kernel_time_ms) continue;  // nothing to choose
    if (l.opt_in.empty() && !l.request.inputs.empty())
      continue;  // shapes unknown at opt: keep heuristic
    if (options.cache) {
      if (const TimingEntry* e = options.cache->Find(l.signature)) {
        auto it =
            std::find_if(l.candidates.begin(), l.candidates.end(), [&](const TacticCandidate& c) {
              return c.provider->id() == e->provider_id && c.tactic.name == e->tactic.name &&
                     c.tactic.params == e->tactic.params;
            });
        if (it != l.candidates.end()) {
          l.chosen = static_cast<size_t>(it - l.candidates.begin());
          l.time_ms = e->time_ms;
          ++report->timing_cache_hits;
          continue;
        }
      }
    }
    to_time.push_back(&l);
  }
  // Phase 3: timing, biggest layers first.
  std::stable_sort(to_time.begin(), to_time.end(), [](const LayerSearch* a, const LayerSearch* b) {
    return ExpectedWork(*a) > ExpectedWork(*b);
  });
  // A layer whose signature was fully searched earlier in this build takes that choice instead of
  // being timed again: the repeated blocks of a transformer are timed once, and the engine is the
  // one a rebuild from the timing cache gives (it keeps one entry per signature).
  std::unordered_map<std::string, const LayerSearch*> searched;
  int64_t done = 0;
  auto report_progress = [&](const LayerSearch& l) {
    ++done;
    if (!options.progress) return true;
    BuildProgress p{"tactics", done, static_cast<int64_t>(to_time.size()),
                    std::chrono::duration<double>(Clock::now() - options.start).count(),
                    fmt::format("{} -> {}", l.node->name(), l.candidates[l.chosen].tactic.name)};
    return options.progress(p);
  };
  for (LayerSearch* l : to_time) {
    if (Expired(options)) {
      report->deadline_hit = true;
      break;
    }
    if (auto it = searched.find(l->signature); it != searched.end()) {
      const TacticCandidate& first = it->second->candidates[it->second->chosen];
      auto same =
          std::find_if(l->candidates.begin(), l->candidates.end(), [&](const TacticCandidate& c) {
            return c.provider == first.provider && c.tactic.name == first.tactic.name &&
                   c.tactic.params == first.tactic.params;
          });
      if (same != l->candidates.end()) {
        l->chosen = static_cast<size_t>(same - l->candidates.begin());
        l->time_ms = it->second->time_ms;
        ++report->tactics_reused;
        if (!report_progress(*l)) break;  // cancelled: keep the best engine so far
        continue;
      }
    }
    double best = -1;
    size_t best_index = l->chosen;
    bool complete = true;  // every candidate was timed (not cut off by the deadline)
    for (size_t i = 0; i < l->candidates.size(); ++i) {
      if (Expired(options)) {
        report->deadline_hit = true;
        complete = false;
        break;
      }
      auto t = TimeTactic(backend, *l, l->candidates[i], options);
      if (t.ok() && t->runs == 0) {  // the deadline passed while it was being set up
        clock.Timed(*l, *t, /*counted=*/false);
        report->deadline_hit = true;
        complete = false;
        break;
      }
      ++report->tactics_timed;
      if (t.ok()) {
        clock.Timed(*l, *t);
      } else {
        clock.Failed(*l);
      }
      if (!t.ok()) {
        KILN_LOG(Debug, BUILD, "tactic {} failed on '{}': {}", l->candidates[i].tactic.name,
                 l->node->name(), t.status().ToString());
        continue;
      }
      if (options.max_kernel_time_ms && t->max_ms > *options.max_kernel_time_ms) {
        KILN_LOG(Info, BUILD,
                 "tactic {} on '{}' rejected: a launch took {:.3f} ms > --max-kernel-time {} ms",
                 l->candidates[i].tactic.name, l->node->name(), t->max_ms,
                 *options.max_kernel_time_ms);
        continue;
      }
      if (best < 0 || t->median_ms < best) {
        best = t->median_ms;
        best_index = i;
      }
    }
    if (best >= 0) {
      l->chosen = best_index;
      l->time_ms = best;
      if (complete) searched.emplace(l->signature, l);
      if (options.cache) {
        options.cache->Insert(l->signature, {std::string(l->candidates[best_index].provider->id()),
                                             l->candidates[best_index].tactic, best});
      }
    } else if (options.max_kernel_time_ms && !report->deadline_hit) {
      return MakeError(ErrorCode::kNoTactic,
                       "every tactic of layer '{}' ({}) ran longer than --max-kernel-time {} ms in "
                       "a single launch",
                       l->node->name(), l->node->op_type(), *options.max_kernel_time_ms);
    }
    if (!report_progress(*l)) break;  // cancelled: keep the best engine so far
  }
  return OkStatus();
}

}  // namespace kiln
