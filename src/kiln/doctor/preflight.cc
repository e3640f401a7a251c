// Preflight checks over machine facts (pure), the NVML facts check, and the top-level run.
#include "kiln/doctor/preflight.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "kiln/core/params.h"
#include "kiln/doctor/env_check.h"
#include "kiln/obs/nvml.h"

extern char** environ;

namespace kiln::doctor {

namespace {

const LibraryFacts* Lib(const MachineFacts& f, std::string_view name) {
  for (const auto& l : f.libraries) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

std::string ComponentVersion(const MachineFacts& f, std::string_view component) {
  if (component == "driver") return f.driver_version;
  if (const LibraryFacts* l = Lib(f, component); l && l->found) return l->version;
  return {};
}

int LaunchEnvInt(const std::map<std::string, std::string>& env,
                 std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = env.find(n);
    if (it != env.end()) return std::atoi(it->second.c_str());
  }
  return -1;
}

}  // namespace

std::string FormatBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

StatusOr<double> ParseMemoryBudget(std::string_view text) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || !(v > 0) || !std::isfinite(v)) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--memory-budget '{}' is not a positive number of bytes (8GiB, 512MiB) or a "
                     "share of free memory (0.5)",
                     text);
  }
  std::string_view unit(p, text.data() + text.size() - p);
  static const std::pair<std::string_view, double> kUnits[] = {{"", 1},
                                                               {"B", 1},
                                                               {"K", 1024.0},
                                                               {"KiB", 1024.0},
                                                               {"KB", 1e3},
                                                               {"M", 1048576.0},
                                                               {"MiB", 1048576.0},
                                                               {"MB", 1e6},
                                                               {"G", 1073741824.0},
                                                               {"GiB", 1073741824.0},
                                                               {"GB", 1e9},
                                                               {"T", 1099511627776.0},
                                                               {"TiB", 1099511627776.0}};
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) {
      if (name.empty() && v <= 1) return v;  // a share
      // Without a unit, a value above 1 must be whole bytes of a plausible size.
      if (name.empty() && (v < 1024 || v != std::floor(v))) break;
      if (v * mult < 1024) break;
      return v * mult;
    }
  }
  return MakeError(ErrorCode::kInvalidArgument,
                   "--memory-budget '{}': unknown unit '{}' (use B, KiB, MiB, GiB, TiB, or a share "
                   "such as 0.5)",
                   text, unit);
}

CudaCodeMatch CudaCodeFor(std::string_view archs, int major, int minor) {
  CudaCodeMatch best;
  int best_sass = -1, best_ptx = -1;
  const int gpu = major * 10 + minor;
  size_t pos = 0;
  while (pos <= archs.size()) {
    size_t end = archs.find_first_of(";,", pos);
    if (end == std::string_view::npos) end = archs.size();
    std::string_view entry = archs.substr(pos, end - pos);
    pos = end + 1;
    int num = 0;
    size_t i = 0;
    while (i < entry.size() && entry[i] >= '0' && entry[i] <= '9')
      num = num * 10 + (entry[i++] - '0');
    if (i == 0) continue;  // "all", "native": nothing to tell from the text
    const bool specific = i < entry.size() && (entry[i] == 'a' || entry[i] == 'f');
    std::string_view suffix = entry.substr(i + (specific ? 1 : 0));
    const bool real = suffix != "-virtual", virt = suffix != "-real";
    const bool sass_runs = specific ? num == gpu : (num / 10 == major && num % 10 <= minor);
    if (real && sass_runs && num > best_sass) {
      best_sass = num;
      best.sass = fmt::format("sm_{}{}", num, specific ? std::string(1, entry[i]) : "");
    }
    if (virt && !specific && num <= gpu && num > best_ptx) {
      best_ptx = num;
      best.ptx = fmt::format("compute_{}", num);
    }
  }
  return best;
}

std::vector<Finding> CheckMachine(const MachineFacts& f, const KnownProblems& kp,
                                  const MemoryPlan& plan) {
  std::vector<Finding> out;
  auto add = [&](Severity s, std::string check, std::string what, std::string why = {},
                 std::string todo = {}) {
    out.push_back(Finding{s, std::move(check), std::move(what), std::move(why), std::move(todo)});
  };
  add(Severity::kInfo, "kiln.version", "kiln " + f.kiln_version);

  // Driver and GPUs.
  const bool has_gpu = !f.gpus.empty();
  if (!has_gpu) {
    add(plan.set ? Severity::kError : Severity::kWarning, "gpu.none",
        fmt::format("no GPU: {}", f.gpu_error.empty() ? "none listed" : f.gpu_error),
        "without a GPU kiln builds and runs with the CPU backend only",
        plan.set ? "run the job's GPU preflight on a GPU node"
                 : "nothing to do on a CPU-only machine");
  } else {
    add(Severity::kInfo, "driver",
        fmt::format("NVIDIA driver {} (CUDA {}.{} driver API), {} GPU(s)",
                    f.driver_version.empty() ? "(version unknown)" : f.driver_version,
                    f.cuda_driver_api / 1000, f.cuda_driver_api % 1000 / 10, f.gpus.size()));
  }
  // Libraries.
  for (const LibraryFacts& l : f.libraries) {
    if (l.found) {
      add(Severity::kInfo, "lib." + l.name, fmt::format("{} {} ({})", l.name, l.version, l.detail));
    } else {
      add(has_gpu ? Severity::kWarning : Severity::kInfo, "lib." + l.name,
          fmt::format("{} not found: {}", l.name, l.detail),
          l.name == "nccl" ? "multi-GPU jobs need NCCL for communicators and engine broadcast"
                           : "the CUDA backend offers fewer tactics without it",
          "add the folder holding the library to LD_LIBRARY_PATH (PyTorch wheels ship cuDNN and "
          "NCCL under site-packages/nvidia/*/lib)");
    }
  }
  // Driver API older than the runtime.
  if (const LibraryFacts* rt = Lib(f, "cudart"); rt && rt->found && f.cuda_driver_api > 0) {
    int rt_major = std::atoi(rt->version.c_str());
    int drv_major = f.cuda_driver_api / 1000;
    if (drv_major < rt_major) {
      add(Severity::kError, "version.cuda",
          fmt::format("CUDA runtime {} is newer than the driver's CUDA {}.{}", rt->version,
                      drv_major, f.cuda_driver_api % 1000 / 10),
          "a runtime of a newer major version than the driver fails with 'CUDA driver version is "
          "insufficient for CUDA runtime version' (error 35)",
          "upgrade the driver or use libraries built for the driver's CUDA version");
    }
  }
  // Known-problem table.
  for (const VersionRule& r : kp.versions()) {
    std::string have = ComponentVersion(f, r.component);
    if (have.empty() || CompareVersions(have, r.below) >= 0) continue;
    if (!r.when_component.empty()) {
      std::string other = ComponentVersion(f, r.when_component);
      if (other.empty() || CompareVersions(other, r.when_at_least) < 0) continue;
    }
    add(r.severity, "version." + r.id, fmt::format("{} ({} {})", r.what, r.component, have), r.why,
        r.todo);
  }
  // Per GPU.
  for (const GpuFacts& g : f.gpus) {
    std::string id = fmt::format("gpu{}", g.index);
    add(Severity::kInfo, id,
        fmt::format(
            "GPU {}: {} ({}), compute capability {}.{}, {} total{}", g.index, g.name, g.pci_bus,
            g.cc_major, g.cc_minor, FormatBytes(static_cast<double>(g.total_bytes)),
            g.free_bytes ? fmt::format(", {} free", FormatBytes(static_cast<double>(*g.free_bytes)))
                         : ""));
    if (g.kernel_exec_timeout == 1) {
      add(Severity::kWarning, id + ".watchdog",
          fmt::format("GPU {} has a kernel-execution watchdog (it drives a display)", g.index),
          "kernels running longer than the display watchdog allows are killed with CUDA error 702 "
          "(cudaErrorLaunchTimeout); no environment variable changes that",
          "use a GPU without a display for builds, or bound kernels with kiln build "
          "--max-kernel-time");
    } else if (g.kernel_exec_timeout == 0) {
      add(Severity::kInfo, id + ".watchdog",
          fmt::format("GPU {}: no kernel-execution watchdog (cudaDevAttrKernelExecTimeout = 0)",
                      g.index));
    }
    if (g.compute_mode == 2) {
      add(Severity::kError, id + ".compute-mode",
          fmt::format("GPU {} is in compute mode PROHIBITED", g.index),
          "no process can create a context on it", "nvidia-smi -i N -c DEFAULT (root)");
    } else if (g.compute_mode == 3 || g.compute_mode == 1) {
      add(plan.ranks_per_gpu > 1 ? Severity::kError : Severity::kWarning, id + ".compute-mode",
          fmt::format("GPU {} is in an exclusive compute mode", g.index),
          "only one process may hold a context; a second process on the GPU fails with CUDA error "
          "46 (device busy or unavailable). Exclusive mode does not disable any watchdog",
          "nvidia-smi -i N -c DEFAULT (root) when ranks or tools share the GPU");
    }
    if (g.cc_major > 0 && !f.cuda_archs.empty()) {
      const CudaCodeMatch code = CudaCodeFor(f.cuda_archs, g.cc_major, g.cc_minor);
      const std::string gpu = fmt::format("GPU {} ({}, compute capability {}.{})", g.index, g.name,
                                          g.cc_major, g.cc_minor);
      if (!code.sass.empty()) {
        add(Severity::kInfo, id + ".arch",
            fmt::format("{}: this kiln carries {} machine code for it", gpu, code.sass));
      } else if (!code.ptx.empty()) {
        add(Severity::kWarning, id + ".arch",
            fmt::format("{}: no machine code for it in this kiln; the driver JIT-compiles its {} "
                        "PTX at first use",
                        gpu, code.ptx),
            "the first process on a node spends seconds to minutes compiling kernels (the "
            "driver caches them in ~/.nv/ComputeCache); kernels compiled for the exact "
            "architecture may also run faster",
            fmt::format("rebuild kiln with -DKILN_CUDA_ARCHS=\"{};{}{}-real\"", f.cuda_archs,
                        g.cc_major, g.cc_minor));
      } else {
        add(Severity::kError, id + ".arch",
            fmt::format("{}: this kiln has no code for it (built for {})", gpu, f.cuda_archs),
            "its CUDA kernels cannot load on this GPU: no machine code of its architecture and "
            "no PTX old enough for the driver to compile",
            fmt::format("rebuild kiln with -DKILN_CUDA_ARCHS=\"{};{}{}-real\"", f.cuda_archs,
                        g.cc_major, g.cc_minor));
      }
    }
    if (plan.set) {
      if (!g.free_bytes) {
        add(Severity::kWarning, id + ".memory",
            fmt::format("GPU {}: free memory unknown, the memory plan cannot be checked", g.index),
            "creating a context on the GPU failed", "check that no process holds it exclusively");
      } else {
        double free = static_cast<double>(*g.free_bytes);
        double per_rank = plan.budget <= 1 ? plan.budget * free : plan.budget;
        double need = per_rank * plan.ranks_per_gpu;
        std::string plan_text =
            plan.budget <= 1
                ? fmt::format("{} ranks x {:.0f}% of free memory", plan.ranks_per_gpu,
                              plan.budget * 100)
                : fmt::format("{} ranks x {}", plan.ranks_per_gpu, FormatBytes(plan.budget));
        if (need > free * 1.0000001) {
          add(Severity::kError, id + ".memory",
              fmt::format("GPU {}: the plan needs {} ({}) but {} is free", g.index,
                          FormatBytes(need), plan_text, FormatBytes(free)),
              "builds or contexts beyond free memory fail with out of memory (TensorRT, CUDA) or "
              "KILN-E3002",
              "lower --memory-budget, use fewer ranks per GPU, or free the GPU (nvidia-smi shows "
              "other processes)");
        } else if (need > free * 0.9) {
          add(Severity::kWarning, id + ".memory",
              fmt::format("GPU {}: the plan uses {} of {} free ({})", g.index, FormatBytes(need),
                          FormatBytes(free), plan_text),
              "less than 10% headroom: the CUDA context, NCCL buffers and fragmentation need some",
              "leave at least 10% of free memory outside the budget");
        } else {
          add(Severity::kInfo, id + ".memory",
              fmt::format("GPU {}: plan {} = {} of {} free", g.index, plan_text, FormatBytes(need),
                          FormatBytes(free)));
        }
      }
    }
  }
  // Peer access between every pair.
  for (size_t i = 0; i < f.peer.size(); ++i) {
    for (size_t j = i + 1; j < f.peer.size() && j < f.peer[i].size(); ++j) {
      int a = f.peer[i][j], b = j < f.peer.size() && i < f.peer[j].size() ? f.peer[j][i] : a;
      if (a == 0 || b == 0) {
        add(Severity::kWarning, fmt::format("peer.{}-{}", i, j),
            fmt::format("GPUs {} and {} have no peer access", i, j),
            "NCCL then moves data between them through host memory, which is slower",
            "check the topology (nvidia-smi topo -m); on servers with NVLink this is a fault");
      }
    }
  }
  if (f.peer.size() > 1) {
    bool all = true;
    for (size_t i = 0; i < f.peer.size(); ++i)
      for (size_t j = 0; j < f.peer[i].size(); ++j) all &= i == j || f.peer[i][j] == 1;
    if (all)
      add(Severity::kInfo, "peer", fmt::format("peer access between all {} GPUs", f.peer.size()));
  }
  // Launcher: more local ranks than GPUs cannot work with one NCCL communicator.
  int local = LaunchEnvInt(
      f.env, {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"});
  if (local > 0 && has_gpu && local > static_cast<int>(f.gpus.size())) {
    add(Severity::kError, "launch.ranks-per-gpu",
        fmt::format("{} local ranks for {} GPU(s)", local, f.gpus.size()),
        "two ranks cannot share one GPU in one NCCL communicator (NCCL fails with invalid usage), "
        "and memory is split between them",
        "launch one rank per GPU (torchrun --nproc-per-node = GPU count)");
  }
  return out;
}

NvmlFacts GatherNvmlFacts(obs::GpuSource& source) {
  NvmlFacts facts;
  facts.available = true;
  for (int i = 0; i < source.DeviceCount(); ++i) {
    NvmlGpuFacts g;
    g.index = i;
    if (auto info = source.Info(i); info.ok()) g.pci_bus = info->pci_bus_id;
    auto h = source.MemoryHealth(i);
    if (!h.ok()) {
      g.error = h.status().message();
      facts.gpus.push_back(std::move(g));
      continue;
    }
    g.ecc_enabled = h->ecc_enabled;
    g.ecc_enabled_pending = h->ecc_enabled_pending;
    g.ecc_uncorrected_volatile = h->ecc_uncorrected_volatile;
    g.ecc_uncorrected_aggregate = h->ecc_uncorrected_aggregate;
    if (h->remapped_rows_correctable) g.remapped_rows_correctable = *h->remapped_rows_correctable;
    if (h->remapped_rows_uncorrectable)
      g.remapped_rows_uncorrectable = *h->remapped_rows_uncorrectable;
    g.remap_pending = h->remap_pending;
    g.remap_failure = h->remap_failed;
    if (h->retired_pages_sbe) g.retired_pages_sbe = *h->retired_pages_sbe;
    if (h->retired_pages_dbe) g.retired_pages_dbe = *h->retired_pages_dbe;
    g.retired_pages_pending = h->retired_pages_pending;
    for (const obs::CallError& e : h->errors)
      g.failed_calls.push_back(fmt::format("{}: {} (NVML error {})", e.call, e.message, e.code));
    facts.gpus.push_back(std::move(g));
  }
  return facts;
}

NvmlFacts GatherNvmlFacts() {
  auto nvml = obs::Nvml::Load();
  if (!nvml.ok()) {
    NvmlFacts facts;
    facts.reason = nvml.status().message();
    return facts;
  }
  return GatherNvmlFacts(**nvml);
}

std::vector<Finding> CheckNvml(const NvmlFacts& nvml) {
  std::vector<Finding> out;
  if (!nvml.available) {
    out.push_back({Severity::kInfo, "nvml",
                   fmt::format("ECC and row remapping not checked: {}", nvml.reason), "", ""});
    return out;
  }
  for (const NvmlGpuFacts& g : nvml.gpus) {
    std::string id = fmt::format("gpu{}", g.index);
    if (g.ecc_uncorrected_volatile.value_or(0) > 0) {
      out.push_back(
          {Severity::kError, id + ".ecc",
           fmt::format("GPU {} ({}) has {} uncorrected ECC error(s) since the last reset", g.index,
                       g.pci_bus, *g.ecc_uncorrected_volatile),
           "memory returned bad data; jobs on it may fail (Xid 48/94/95) or compute garbage",
           "drain and reset the GPU (nvidia-smi -r) so rows are remapped; replace it if "
           "errors recur"});
    } else if (g.ecc_uncorrected_aggregate.value_or(0) > 0) {
      out.push_back({Severity::kWarning, id + ".ecc",
                     fmt::format("GPU {} ({}) has {} uncorrected ECC error(s) in its lifetime",
                                 g.index, g.pci_bus, *g.ecc_uncorrected_aggregate),
                     "past memory errors; the rows should have been remapped",
                     "check nvidia-smi -q -d ROW_REMAPPER; watch for new errors"});
    }
    if (g.remap_failure.value_or(false)) {
      out.push_back({Severity::kError, id + ".remap",
                     fmt::format("GPU {} ({}): row remapping failed", g.index, g.pci_bus),
                     "a faulty memory row could not be remapped (Xid 64)",
                     "drain the GPU and open a hardware case"});
    } else if (g.remap_pending.value_or(false)) {
      out.push_back({Severity::kWarning, id + ".remap",
                     fmt::format("GPU {} ({}): a row remap is pending", g.index, g.pci_bus),
                     "the remap takes effect only at the next GPU reset",
                     "reset the GPU when it is idle (nvidia-smi -r -i N)"});
    }
    if (g.ecc_enabled.has_value() && !*g.ecc_enabled) {
      out.push_back({Severity::kWarning, id + ".ecc-mode",
                     fmt::format("GPU {} ({}) has ECC disabled", g.index, g.pci_bus),
                     "memory errors go undetected", "nvidia-smi -e 1 and reboot (root)"});
    } else if (g.ecc_enabled.value_or(false) && g.ecc_enabled_pending.has_value() &&
               !*g.ecc_enabled_pending) {
      out.push_back(
          {Severity::kWarning, id + ".ecc-mode",
           fmt::format("GPU {} ({}): ECC will be off after the next reboot", g.index, g.pci_bus),
           "someone ran nvidia-smi -e 0; memory errors will then go undetected",
           "nvidia-smi -i N -e 1 before the reboot (root)"});
    }
    // Page retirement (before Ampere): pages with a double-bit error, or repeated single-bit
    // errors, are taken out of use at the next driver load.
    if (g.retired_pages_pending.value_or(false)) {
      out.push_back({Severity::kWarning, id + ".retired-pages",
                     fmt::format("GPU {} ({}): a page retirement is pending", g.index, g.pci_bus),
                     "the bad page stays in use until the driver reloads (Xid 63 on older GPUs)",
                     "drain the GPU and reset it or reboot the node so the page is retired"});
    } else if (g.retired_pages_dbe.value_or(0) > 0 || g.retired_pages_sbe.value_or(0) > 0) {
      uint64_t dbe = g.retired_pages_dbe.value_or(0), sbe = g.retired_pages_sbe.value_or(0);
      // NVIDIA's guidance for page retirement: a board is replaced at 60 or more retired pages.
      bool many = dbe + sbe >= 60;
      out.push_back(
          {many ? Severity::kError : Severity::kInfo, id + ".retired-pages",
           fmt::format("GPU {} ({}) has retired {} page(s) ({} double-bit, {} repeated "
                       "single-bit)",
                       g.index, g.pci_bus, dbe + sbe, dbe, sbe),
           many ? "the retirement budget of the board is used up"
                : "retired pages are out of use; the GPU is fine while the count stays low",
           many ? "drain the GPU and open a hardware case" : ""});
    }
    if (!g.error.empty()) {
      out.push_back(
          {Severity::kWarning, id + ".nvml",
           fmt::format("GPU {} ({}): memory health not read: {}", g.index, g.pci_bus, g.error),
           "NVML could not query this GPU", "check nvidia-smi -q -i N -d ECC,ROW_REMAPPER"});
      continue;
    }
    for (const std::string& call : g.failed_calls) {
      out.push_back({Severity::kWarning, id + ".nvml",
                     fmt::format("GPU {} ({}): an NVML query failed: {}", g.index, g.pci_bus, call),
                     "that part of the memory health is unknown", "check nvidia-smi -q -i N"});
    }
    // What was read, so a healthy GPU shows that it was checked (and with which counters).
    auto opt = [](const auto& v) {
      return v.has_value() ? fmt::format("{}", *v) : std::string("n/a");
    };
    out.push_back(
        {Severity::kInfo, id + ".memory-health",
         fmt::format("GPU {} ({}): ECC {}; uncorrected errors volatile {} aggregate {}; remapped "
                     "rows {} correctable {} uncorrectable, remap pending {}, remap failure {}; "
                     "retired pages {} single-bit {} double-bit, pending {}",
                     g.index, g.pci_bus,
                     g.ecc_enabled.has_value() ? (*g.ecc_enabled ? "on" : "off") : "n/a",
                     opt(g.ecc_uncorrected_volatile), opt(g.ecc_uncorrected_aggregate),
                     opt(g.remapped_rows_correctable), opt(g.remapped_rows_uncorrectable),
                     opt(g.remap_pending), opt(g.remap_failure), opt(g.retired_pages_sbe),
                     opt(g.retired_pages_dbe), opt(g.retired_pages_pending)),
         "", ""});
  }
  return out;
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq != std::string_view::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

PreflightReport RunPreflight(const KnownProblems& kp, const MemoryPlan& plan,
                             const std::map<std::string, std::string>& env) {
  PreflightReport r;
  r.facts = ProbeMachine(env);
  r.findings = CheckMachine(r.facts, kp, plan);
  for (Finding& f : CheckEnvironment(kp, r.facts.env, &r.facts.interfaces))
    r.findings.push_back(std::move(f));
  // kiln's own knobs (params.inc) with the values this process would use.
  for (const param::ParamInfo& p : param::AllParams()) {
    auto it = env.find(std::string(p.env));
    r.findings.push_back({Severity::kInfo, fmt::format("param.{}", p.env),
                          it != env.end() ? fmt::format("{}={} ({})", p.env, it->second, p.meaning)
                                          : fmt::format("{} unset, default '{}' ({})", p.env,
                                                        p.default_value, p.meaning),
                          "", ""});
  }
  // ECC and row remapping come from NVML through the obs layer's wrapper.
  for (Finding& f : CheckNvml(GatherNvmlFacts())) r.findings.push_back(std::move(f));
  std::stable_sort(r.findings.begin(), r.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity > b.severity; });
  return r;
}

}  // namespace kiln::doctor
