// The anytime search. Order of work: (1) heuristic tactic for all layers, (2) timing-cache hits,
// (3) timing, biggest expected gain first, stopping at the deadline with the best choices so far.
// Timing goes by windows of layer signatures: the candidates of a window are set up (created,
// prepared) by a bounded set of threads, then timed one after another with nothing else running.
#include "kiln/builder/tactic_search.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kiln/core/logging.h"
#include "kiln/ir/sizes.h"

namespace kiln {

std::vector<TacticConfig> TakeTactics(std::vector<TacticConfig> offered, std::string_view prefix,
                                      int per_family) {
  std::vector<TacticConfig> taken;
  std::unordered_map<std::string, int> per;  // tactics taken of each family
  for (TacticConfig& t : offered) {
    if (!prefix.empty() && !t.name.starts_with(prefix)) continue;
    int& n = per[t.family];
    if (per_family > 0 && n == per_family) continue;
    ++n;
    taken.push_back(std::move(t));
  }
  return taken;
}

namespace {
using Clock = std::chrono::steady_clock;

bool Expired(const TacticSearchOptions& o) { return o.deadline && Clock::now() >= *o.deadline; }

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

// Uniform values in [-1, 1) (integers: 0). A block of random elements is repeated over the
// tensor: converting every element of a batch-32 activation through the generator took most of
// a candidate's set-up (tens of millions of elements), and a kernel's speed does not depend on
// the values repeating.
void FillRandom(Tensor& t, std::mt19937& rng) {
  constexpr int64_t kBlock = 4096;
  const int64_t n = t.num_elements();
  const int64_t block = std::min(n, kBlock);
  TensorView v{t.dtype(), t.dims(), t.mutable_raw()};
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < block; ++i) StoreFromDouble(v, i, IsFloat(t.dtype()) ? dist(rng) : 0.0);
  const size_t block_bytes = static_cast<size_t>(block) * SizeOf(t.dtype());
  if (block_bytes == 0) return;
  auto* base = static_cast<std::byte*>(t.mutable_raw());
  const size_t total = t.size_bytes();
  for (size_t at = block_bytes; at < total; at += block_bytes) {
    std::memcpy(base + at, base, std::min(block_bytes, total - at));
  }
}
}  // namespace

StatusOr<TimingInputs> MakeTimingInputs(Backend& backend, const LayerSearch& layer) {
  const auto start = Clock::now();
  TimingInputs in;
  std::mt19937 rng(1234);
  const bool host = backend.host_accessible();
  auto place = [&](const Tensor& t) -> StatusOr<void*> {
    if (host) return const_cast<void*>(t.raw());
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend.Allocate(std::max<size_t>(t.size_bytes(), 1)));
    KILN_RETURN_IF_ERROR(backend.CopyToDevice(b.data(), t.raw(), t.size_bytes(), nullptr));
    void* p = b.data();
    in.buffers.push_back(std::move(b));
    return p;
  };
  in.host_inputs.reserve(layer.request.inputs.size());
  for (size_t i = 0; i < layer.request.inputs.size(); ++i) {
    const OperandDesc& d = layer.request.inputs[i];
    if (d.dtype == DataType::kUndefined) {
      in.host_inputs.emplace_back();
      continue;
    }
    if (d.constant) {
      in.host_inputs.push_back(*d.constant);
    } else {
      in.host_inputs.emplace_back(d.dtype, layer.opt_in[i]);
      FillRandom(in.host_inputs.back(), rng);
    }
  }
  in.host_outputs.reserve(layer.request.outputs.size());
  for (size_t i = 0; i < layer.request.outputs.size(); ++i) {
    in.host_outputs.emplace_back(layer.request.outputs[i].dtype, layer.opt_out[i]);
  }
  for (const Tensor& t : in.host_inputs) {
    if (t.empty()) {
      in.ins.push_back({});
      continue;
    }
    KILN_ASSIGN_OR_RETURN(void* p, place(t));
    in.ins.push_back({t.dtype(), t.dims(), p});
  }
  for (Tensor& t : in.host_outputs) {
    KILN_ASSIGN_OR_RETURN(void* p, place(t));
    in.outs.push_back({t.dtype(), t.dims(), p});
  }
  in.seconds = Since(start);
  return in;
}

StatusOr<PreparedTactic> PrepareTactic(Backend& backend, const LayerSearch& layer,
                                       const TacticCandidate& c, const TimingInputs& inputs) {
  const auto start = Clock::now();
  PreparedTactic p;
  KILN_ASSIGN_OR_RETURN(p.kernel, c.provider->Create(layer.request, c.tactic));
  KILN_ASSIGN_OR_RETURN(p.workspace_bytes, p.kernel->Prepare(inputs.ins, inputs.outs));
  if (p.workspace_bytes) {
    KILN_ASSIGN_OR_RETURN(p.workspace, backend.Allocate(p.workspace_bytes));
  }
  p.seconds = Since(start);
  return p;
}

StatusOr<TacticTiming> RunTiming(Backend& backend, PreparedTactic& p, const TimingInputs& inputs,
                                 const TacticSearchOptions& options, double best_ms) {
  KernelRunArgs args;
  args.inputs = inputs.ins;
  args.outputs = inputs.outs;
  args.workspace = p.workspace.data();
  args.workspace_bytes = p.workspace_bytes;
  TacticTiming t;
  t.setup_seconds = p.seconds;
  // At the deadline nothing more is run: a candidate whose set-up used up the time is left
  // untimed (runs == 0), and one whose warm-up run crossed the deadline is judged by that run, so
  // what runs past the deadline is at most one set-up and one launch.
  if (Expired(options)) return t;
  const auto run_start = Clock::now();
  const bool stop_early = options.early_stop && best_ms > 0;
  std::vector<double> times;
  double total = 0;
  // A candidate's first launch can carry one-time costs (the CUDA driver loads a kernel's module
  // lazily at its first launch; libraries initialise), so the early stop judges the fastest of at
  // least two runs: never the first run alone.
  double warm_fastest = 0;
  for (int i = 0; i < options.warmup_runs; ++i) {
    auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(p.kernel->Run(args));
    KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    warm_fastest = i == 0 ? ms : std::min(warm_fastest, ms);
    const bool slow = stop_early && i >= 1 && warm_fastest > best_ms * kEarlyStopWarmupRatio;
    if (Expired(options) || slow) {
      times.push_back(ms);
      total = ms;
      t.stopped_early = slow;
      break;
    }
  }
  double fastest = times.empty() ? 0 : times.front();
  while (times.empty() || (!t.stopped_early && static_cast<int>(times.size()) < options.max_runs &&
                           !Expired(options))) {
    auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(p.kernel->Run(args));
    KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    fastest = times.empty() ? ms : std::min(fastest, ms);
    times.push_back(ms);
    total += ms;
    if (options.max_kernel_time_ms && ms > *options.max_kernel_time_ms) break;  // rejected anyway
    if (stop_early && fastest > best_ms * kEarlyStopRatio) {
      t.stopped_early = true;
      break;
    }
    if (static_cast<int>(times.size()) >= options.min_runs && total >= options.min_total_ms) break;
    if (options.settle_ratio > 0 && times.size() == 2 && total >= options.min_total_ms &&
        std::max(times[0], times[1]) <= options.settle_ratio * std::min(times[0], times[1])) {
      break;
    }
  }
  t.run_seconds = Since(run_start);
  t.runs = static_cast<int>(times.size());
  t.max_ms = *std::max_element(times.begin(), times.end());
  std::sort(times.begin(), times.end());
  t.median_ms = times[times.size() / 2];
  return t;
}

StatusOr<TacticTiming> TimeTactic(Backend& backend, const LayerSearch& layer,
                                  const TacticCandidate& c, const TacticSearchOptions& options) {
  KILN_ASSIGN_OR_RETURN(TimingInputs inputs, MakeTimingInputs(backend, layer));
  KILN_ASSIGN_OR_RETURN(PreparedTactic p, PrepareTactic(backend, layer, c, inputs));
  p.seconds += inputs.seconds;
  return RunTiming(backend, p, inputs, options);
}

int RunBounded(Backend& backend, int threads, size_t n, const std::function<void(size_t)>& task) {
  std::atomic<size_t> next{0};
  std::atomic<int> running{0}, peak{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      int now = running.fetch_add(1) + 1;
      int seen = peak.load();
      while (now > seen && !peak.compare_exchange_weak(seen, now)) {
      }
      task(i);
      running.fetch_sub(1);
    }
  };
  const int helpers = static_cast<int>(std::min<size_t>(n, std::max(threads, 1))) - 1;
  std::vector<std::thread> pool;
  pool.reserve(std::max(helpers, 0));
  for (int t = 0; t < helpers; ++t) {
    pool.emplace_back([&] {
      if (Status s = backend.BindThread(); !s.ok()) {
        KILN_LOG(Warn, BUILD, "set-up thread: {}", s.ToString());
        return;  // the others (and the caller) take its share
      }
      work();
    });
  }
  work();
  for (std::thread& t : pool) t.join();
  return peak.load();
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
  SignatureTime& at(const LayerSearch& l) { return times_[index_.at(l.signature)]; }
  void Inputs(const LayerSearch& l, double seconds) {
    at(l).inputs_seconds += seconds;
    at(l).setup_seconds += seconds;
  }
  void SetUp(const LayerSearch& l, double seconds) {
    ++at(l).setups;
    at(l).setup_seconds += seconds;
  }
  // A candidate timed (counted) or only set up before the deadline stopped it (not counted).
  void Timed(const LayerSearch& l, const TacticTiming& timing) {
    SignatureTime& t = at(l);
    ++t.timed;
    t.timing_seconds += timing.run_seconds;
    if (timing.stopped_early) ++t.early_stops;
  }
  void Failed(const LayerSearch& l) { ++at(l).timed; }
  void Into(BuildTimeBreakdown& out) {
    std::stable_sort(times_.begin(), times_.end(),
                     [](const SignatureTime& a, const SignatureTime& b) {
                       return a.total_seconds() > b.total_seconds();
                     });
    for (const SignatureTime& t : times_) {
      out.generate_seconds += t.generate_seconds;
      out.setup_seconds += t.setup_seconds;
      out.inputs_seconds += t.inputs_seconds;
      out.timing_seconds += t.timing_seconds;
      out.setups += t.setups;
      out.early_stops += t.early_stops;
    }
    out.signatures = std::move(times_);
  }

 private:
  std::unordered_map<std::string, size_t> index_;
  std::vector<SignatureTime> times_;
};

// What the set-up stage leaves for the timing of one layer: its inputs and its candidates, each
// prepared, failed (status) or not reached before the deadline (nullopt).
struct LayerSetUp {
  StatusOr<TimingInputs> inputs = TimingInputs();
  std::vector<std::optional<StatusOr<PreparedTactic>>> candidates;
};

// The set-up stage for a window of layers: their inputs, then every candidate, spread over the
// threads; candidates not started before the deadline stay unset.
std::vector<LayerSetUp> SetUpWindow(Backend& backend, const std::vector<LayerSearch*>& window,
                                    const TacticSearchOptions& options, SignatureClock& clock,
                                    BuildTimeBreakdown& breakdown) {
  const auto start = Clock::now();
  std::vector<LayerSetUp> out(window.size());
  int peak = RunBounded(backend, options.setup_threads, window.size(), [&](size_t i) {
    out[i].candidates.resize(window[i]->candidates.size());
    if (!Expired(options)) out[i].inputs = MakeTimingInputs(backend, *window[i]);
  });
  std::vector<std::pair<size_t, size_t>> tasks;  // (layer, candidate)
  for (size_t i = 0; i < window.size(); ++i) {
    if (!out[i].inputs.ok()) continue;
    clock.Inputs(*window[i], out[i].inputs->seconds);
    for (size_t c = 0; c < window[i]->candidates.size(); ++c) tasks.push_back({i, c});
  }
  peak = std::max(peak, RunBounded(backend, options.setup_threads, tasks.size(), [&](size_t k) {
                    auto [i, c] = tasks[k];
                    if (Expired(options)) return;
                    out[i].candidates[c] = PrepareTactic(backend, *window[i],
                                                         window[i]->candidates[c], *out[i].inputs);
                  }));
  for (auto [i, c] : tasks) {
    const auto& p = out[i].candidates[c];
    if (p && p->ok()) clock.SetUp(*window[i], (*p)->seconds);
    if (p && !p->ok()) clock.SetUp(*window[i], 0);
  }
  breakdown.setup_wall_seconds += Since(start);
  breakdown.setup_max_concurrency = std::max(breakdown.setup_max_concurrency, peak);
  return out;
}
}  // namespace

Status SearchTactics(Backend& backend, std::vector<LayerSearch>& layers,
                     const TacticSearchOptions& options, BuildReport* report) {
  SignatureClock clock(layers);
  BuildTimeBreakdown& breakdown = report->time_breakdown;
  breakdown.setup_threads = std::max(options.setup_threads, 1);
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
    if (l.from_cache) {  // the builder took the cache's winner without listing the others
      l.time_ms = options.cache ? options.cache->Find(l.signature)->time_ms : -1;
      ++report->timing_cache_hits;
      continue;
    }
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
  // Takes the choice of an earlier layer with the same signature; false when there is none.
  auto reuse = [&](LayerSearch* l) {
    auto it = searched.find(l->signature);
    if (it == searched.end()) return false;
    const TacticCandidate& first = it->second->candidates[it->second->chosen];
    auto same =
        std::find_if(l->candidates.begin(), l->candidates.end(), [&](const TacticCandidate& c) {
          return c.provider == first.provider && c.tactic.name == first.tactic.name &&
                 c.tactic.params == first.tactic.params;
        });
    if (same == l->candidates.end()) return false;
    l->chosen = static_cast<size_t>(same - l->candidates.begin());
    l->time_ms = it->second->time_ms;
    ++report->tactics_reused;
    return true;
  };
  // Times the set-up candidates of one layer; false when the deadline cut it short.
  auto time_layer = [&](LayerSearch* l, LayerSetUp& set_up) -> StatusOr<bool> {
    double best = -1;
    size_t best_index = l->chosen;
    bool complete = true;  // every candidate was timed (not cut off by the deadline)
    for (size_t i = 0; i < l->candidates.size(); ++i) {
      // Not set up: the deadline passed first (inputs that failed fail every candidate).
      if (Expired(options) || (set_up.inputs.ok() && !set_up.candidates[i].has_value())) {
        complete = false;
        break;
      }
      StatusOr<TacticTiming> t = set_up.inputs.status();
      if (set_up.inputs.ok()) {
        StatusOr<PreparedTactic>& p = *set_up.candidates[i];
        t = p.ok() ? RunTiming(backend, *p, *set_up.inputs, options, best)
                   : StatusOr<TacticTiming>(p.status());
        if (p.ok()) p->kernel.reset();  // its memory is not needed any more
      }
      if (t.ok() && t->runs == 0) {  // the deadline passed while it was being set up
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
      KILN_LOG(Debug, BUILD, "tactic {} on '{}': median {:.4f} ms over {} run(s){}",
               l->candidates[i].tactic.name, l->node->name(), t->median_ms, t->runs,
               t->stopped_early ? " (stopped early: clearly slower)" : "");
      if (t->stopped_early) continue;  // clearly slower than `best`
      if (best < 0 || t->median_ms < best) {
        best = t->median_ms;
        best_index = i;
      }
    }
    if (!complete) report->deadline_hit = true;
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
    return complete;
  };
  // Windows of layers with distinct signatures not yet searched; a layer whose signature is
  // already in the window waits for it (and then takes its choice).
  const size_t window_size = static_cast<size_t>(std::max(options.setup_threads, 1));
  std::vector<LayerSearch*> pending(to_time.begin(), to_time.end());
  std::unordered_set<const LayerSearch*> on_its_own;  // could not take its signature's choice
  size_t next = 0;
  while (next < pending.size()) {
    if (Expired(options)) {
      report->deadline_hit = true;
      break;
    }
    std::vector<LayerSearch*> window;
    std::vector<LayerSearch*> waiting;  // same signature as one in the window
    for (; next < pending.size() && window.size() < window_size; ++next) {
      LayerSearch* l = pending[next];
      const bool in_window = std::any_of(window.begin(), window.end(), [&](LayerSearch* w) {
        return w->signature == l->signature;
      });
      if (in_window || (searched.count(l->signature) && !on_its_own.count(l))) {
        waiting.push_back(l);
        continue;
      }
      window.push_back(l);
    }
    std::vector<LayerSetUp> set_ups;
    if (!window.empty()) set_ups = SetUpWindow(backend, window, options, clock, breakdown);
    bool stop = false;
    for (size_t i = 0; i < window.size() && !stop; ++i) {
      if (Expired(options)) {
        report->deadline_hit = true;
        stop = true;
        break;
      }
      KILN_ASSIGN_OR_RETURN(bool complete, time_layer(window[i], set_ups[i]));
      set_ups[i] = LayerSetUp();  // free its inputs and kernels before timing the next layer
      if (!report_progress(*window[i])) stop = true;  // cancelled: keep the best engine so far
      if (!complete) stop = true;
    }
    if (stop) break;
    // Layers that share a signature with one just searched take its choice; one whose
    // candidates lack it (or whose signature's search was cut short) is searched on its own.
    std::vector<LayerSearch*> again;
    for (LayerSearch* l : waiting) {
      if (reuse(l)) {
        if (!report_progress(*l)) {
          stop = true;
          break;
        }
      } else {
        on_its_own.insert(l);
        again.push_back(l);
      }
    }
    if (stop) break;
    pending.insert(pending.begin() + static_cast<std::ptrdiff_t>(next), again.begin(), again.end());
  }
  return OkStatus();
}

}  // namespace kiln
