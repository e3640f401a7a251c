// `kiln inspect`: what is in an ONNX model or a .kiln engine, and what would not be supported,
// all at once.
#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>

#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool json = false;
  bool layers = false;
  std::string backend = "auto";
  std::vector<std::string> profiles;
  bool no_kernels = false;
};

// The kernel check: does every layer of the build's optimised graph have a kernel on the backend?
// Runs only on a model that imports (no unsupported op, a sound structure).
struct KernelCheck {
  bool ran = false;
  std::string backend;
  std::vector<KernelGap> gaps;  // layers without a kernel of the backend's own
  Status error;  // why the check could not run (an unavailable backend, a shape error...)
  // The gaps the backend cannot fill by running the CPU's kernel on the host.
  size_t missing() const {
    return std::count_if(gaps.begin(), gaps.end(), [](const KernelGap& g) { return !g.on_host; });
  }
};

// `graph`: the model as InspectOnnxFile imported it (a build's starting point).
KernelCheck CheckKernels(const InspectOptions& o, std::unique_ptr<Graph> graph) {
  KernelCheck check;
  if (o.no_kernels || !graph) return check;
  check.ran = true;
  BuilderConfig config;
  auto backend = ParseBackend(o.backend);
  if (!backend.ok()) {
    check.error = backend.status();
    return check;
  }
  config.backend = *backend;
  check.backend = std::string(ToString(*backend));
  for (const std::string& p : o.profiles) {
    if (Status s = ParseProfileSpec(p, &config.profile); !s.ok()) {
      check.error = s;
      return check;
    }
  }
  auto gaps = FindKernelGaps(BuildInput{std::move(graph), o.path, Hash128()}, config);
  if (!gaps.ok()) {
    check.error = gaps.status();
  } else {
    check.gaps = std::move(*gaps);
  }
  return check;
}

std::string Human(int64_t n) {
  if (n >= 1000000) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{}", n);
}

int InspectOnnx(const InspectOptions& o) {
  auto info = InspectOnnxFile(o.path);
  if (!info.ok()) return ReportError(info.status());
  if (o.json) {
    nlohmann::json j;
    j["file"] = o.path;
    j["producer"] = info->meta.producer_name + " " + info->meta.producer_version;
    j["opset"] = info->meta.opset;
    j["ir_version"] = info->meta.ir_version;
    auto tensors = [](const std::vector<OnnxTensorInfo>& ts) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& t : ts)
        a.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
      return a;
    };
    j["inputs"] = tensors(info->inputs);
    j["outputs"] = tensors(info->outputs);
    j["ops"] = info->op_histogram;
    j["nodes"] = info->num_nodes;
    j["parameters"] = info->parameter_count;
    j["parameter_bytes"] = info->parameter_bytes;
    j["dynamic_dims"] = info->symbols;
    nlohmann::json u = nlohmann::json::array();
    for (const auto& op : info->unsupported) {
      u.push_back({{"op", op.op_type}, {"reason", op.reason}, {"nodes", op.node_names}});
    }
    j["unsupported"] = u;
    if (!info->structure.ok()) {
      j["error"] = {{"code", info->structure.Id()}, {"message", info->structure.message()}};
    }
    const KernelCheck kernels = CheckKernels(o, std::move(info->graph));
    if (kernels.ran) {
      nlohmann::json k = {{"backend", kernels.backend}};
      nlohmann::json gaps = nlohmann::json::array(), host = nlohmann::json::array();
      for (const KernelGap& g : kernels.gaps) {
        (g.on_host ? host : gaps)
            .push_back({{"layer", g.layer}, {"op", g.op_type}, {"operands", g.operands}});
      }
      k["missing"] = gaps;
      k["on_host"] = host;
      if (!kernels.error.ok()) {
        k["error"] = {{"code", kernels.error.Id()}, {"message", kernels.error.message()}};
      }
      j["kernels"] = k;
    }
    std::cout << j.dump(2) << "\n";
    if (!info->structure.ok()) return ReportError(info->structure);
    if (!info->unsupported.empty() || kernels.missing() > 0) return 1;
    return kernels.error.ok() ? 0 : ReportError(kernels.error);
  }
  std::cout << fmt::format("{}: ONNX model, opset {}, IR version {}, from {} {}\n", o.path,
                           info->meta.opset, info->meta.ir_version, info->meta.producer_name,
                           info->meta.producer_version);
  std::cout << fmt::format("  {} nodes, {} parameters ({:.2f} MiB)\n", info->num_nodes,
                           Human(info->parameter_count), info->parameter_bytes / double(1 << 20));
  auto print = [](const char* what, const std::vector<OnnxTensorInfo>& ts) {
    for (const auto& t : ts) {
      std::cout << fmt::format("  {:<7} {:<24} {:<5} [{}]\n", what, t.name, t.dtype,
                               fmt::join(t.shape, ", "));
    }
  };
  print("input", info->inputs);
  print("output", info->outputs);
  if (!info->symbols.empty()) {
    std::cout << fmt::format(
        "  dynamic dims: {} (built at 1 unless a --profile gives MIN,OPT,MAX for the input)\n",
        fmt::join(info->symbols, ", "));
  }
  std::cout << "  ops:";
  for (const auto& [op, n] : info->op_histogram) std::cout << fmt::format(" {}x{}", op, n);
  std::cout << "\n";
  if (info->unsupported.empty()) {
    std::cout << "  every op is supported\n";
    if (!info->structure.ok()) return ReportError(info->structure);
    const KernelCheck kernels = CheckKernels(o, std::move(info->graph));
    if (!kernels.ran) return 0;
    if (!kernels.error.ok()) {
      std::cout << fmt::format("  kernels: not checked ({})\n", kernels.error.Id());
      return ReportError(kernels.error);
    }
    if (kernels.gaps.empty()) {
      std::cout << fmt::format(
          "  every layer has a {} kernel (FP32, at the profile's max shapes)\n", kernels.backend);
      return 0;
    }
    const size_t on_host = kernels.gaps.size() - kernels.missing();
    if (on_host > 0) {
      std::cout << fmt::format(
          "  {} layer(s) without a {} kernel run the CPU's on the host inside the engine (two "
          "copies and a host round trip each run):\n",
          on_host, kernels.backend);
      for (const KernelGap& g : kernels.gaps) {
        if (g.on_host)
          std::cout << fmt::format("    {} ({}; {})\n", g.layer, g.op_type, g.operands);
      }
    }
    if (kernels.missing() == 0) return 0;
    std::cout << fmt::format(
        "  {} layer(s) without a {} kernel (a build fails with KILN-E3003 on them):\n",
        kernels.missing(), kernels.backend);
    for (const KernelGap& g : kernels.gaps) {
      if (!g.on_host) std::cout << fmt::format("    {} ({}; {})\n", g.layer, g.op_type, g.operands);
    }
    return 1;
  }
  std::cout << fmt::format("  {} unsupported op type(s):\n", info->unsupported.size());
  for (const auto& op : info->unsupported) {
    std::vector<std::string> names(
        op.node_names.begin(), op.node_names.begin() + std::min<size_t>(op.node_names.size(), 5));
    std::cout << fmt::format("    {} ({} node(s): {}{}) - {}\n", op.op_type, op.node_names.size(),
                             fmt::join(names, ", "), op.node_names.size() > 5 ? ", ..." : "",
                             op.reason);
  }
  if (!info->structure.ok()) return ReportError(info->structure);
  return 1;
}

// What `kiln refit` can renew: one line for people.
std::string RefitSummary(const WeightProgram& p) {
  if (!p.recorded) return "not refittable (no weight program: built before refit; rebuild)";
  std::string out = fmt::format(
      "{} weight(s) from {} initializer(s) through {} step(s); {} initializer(s) must stay as "
      "built",
      p.targets.size(), p.sources.size(), p.steps.size(), p.fixed.size());
  if (p.non_refittable.empty()) return out;
  return out + fmt::format("; {} not refittable, first '{}': {}", p.non_refittable.size(),
                           p.non_refittable.front().constant, p.non_refittable.front().reason);
}

// A weight-stripped engine: how much is absent and how to fill it; "" for a full engine.
std::string StrippedSummary(const EngineDesc& e, const std::string& path, int64_t* absent_bytes) {
  *absent_bytes = 0;
  const std::vector<std::string> absent = AbsentConstants(e);
  if (!e.header.weights_stripped) return "";
  for (const std::string& name : absent) {
    *absent_bytes += static_cast<int64_t>(e.graph->FindValue(name)->constant()->size_bytes());
  }
  return fmt::format(
      "weights stripped: {} constant(s), {:.2f} MiB not in the file (the weight program remakes "
      "them: `kiln refit {} --weights MODEL.onnx`, or `kiln run {} --weights MODEL.onnx`)",
      absent.size(), static_cast<double>(*absent_bytes) / (1 << 20), path, path);
}

int InspectEngine(const InspectOptions& o) {
  LoadOptions opts;
  opts.check_providers = false;  // show engines built where other kernels exist
  auto desc = LoadEngineFile(o.path, opts);
  if (!desc.ok()) return ReportError(desc.status());
  const EngineDesc& e = **desc;
  int64_t absent_bytes = 0;
  const std::string stripped = StrippedSummary(e, o.path, &absent_bytes);
  if (o.json) {
    nlohmann::json j =
        nlohmann::json::parse(e.build_report_json.empty() ? "{}" : e.build_report_json);
    j["file"] = o.path;
    j["header"] = {
        {"format_version", e.header.format_version},    {"kiln_version", e.header.kiln_version},
        {"backend", ToString(e.header.backend)},        {"arch", e.header.device_arch},
        {"libraries", e.header.library_versions},       {"model_hash", e.header.model_hash},
        {"config_hash", e.header.config_hash},          {"model", e.header.model_name},
        {"weights_stripped", e.header.weights_stripped}};
    nlohmann::json unfit = nlohmann::json::array();
    for (const auto& n : e.weight_program.non_refittable) {
      unfit.push_back({{"constant", n.constant}, {"reason", n.reason}});
    }
    j["refit"] = {{"recorded", e.weight_program.recorded},
                  {"weights", e.weight_program.targets.size()},
                  {"initializers", e.weight_program.sources.size()},
                  {"steps", e.weight_program.steps.size()},
                  {"fixed_initializers", e.weight_program.fixed.size()},
                  {"non_refittable", unfit},
                  {"absent_constants", AbsentConstants(e).size()},
                  {"absent_bytes", absent_bytes}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("{}: kiln engine (format {}, kiln {}) for {} / {}\n", o.path,
                           e.header.format_version, e.header.kiln_version,
                           ToString(e.header.backend), e.header.device_arch);
  std::cout << fmt::format("  model {} (hash {}), config hash {}\n", e.header.model_name,
                           e.header.model_hash.substr(0, 16), e.header.config_hash.substr(0, 16));
  for (const Value* v : e.graph->inputs()) {
    const InputProfile* p = e.profile.Find(v->name());
    std::cout << fmt::format(
        "  input  {:<24} {:<5} {}{}\n", v->name(), ToString(v->dtype()), ToString(v->shape()),
        p ? fmt::format("  profile min {} opt {} max {}", fmt::join(p->min, "x"),
                        fmt::join(p->opt, "x"), fmt::join(p->max, "x"))
          : "");
  }
  for (const Value* v : e.graph->outputs()) {
    std::cout << fmt::format("  output {:<24} {:<5} {}\n", v->name(), ToString(v->dtype()),
                             ToString(v->shape()));
  }
  std::cout << fmt::format(
      "  {} layers; memory plan: weights {:.2f} MiB, activations {:.2f} MiB, workspace {:.2f} MiB, "
      "peak {:.2f} MiB\n",
      e.layers.size(), e.plan.weights_bytes / double(1 << 20), e.plan.arena_bytes / double(1 << 20),
      e.plan.workspace_bytes / double(1 << 20), e.plan.peak_bytes / double(1 << 20));
  std::cout << fmt::format("  refit: {}\n", RefitSummary(e.weight_program));
  if (!stripped.empty()) std::cout << "  " << stripped << "\n";
  if (o.layers) {
    for (size_t i = 0; i < e.layers.size(); ++i) {
      const LayerDesc& l = e.layers[i];
      std::cout << fmt::format("  {:>4} {:<32} {:<18} {}\n", i, l.node->name(), l.node->op_type(),
                               l.tactic.name);
    }
  }
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Show what is in an ONNX model or a .kiln engine");
  sub->add_option("file", o->path, "model.onnx or engine.kiln")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_flag("--json", o->json, "print JSON");
  sub->add_flag("--layers", o->layers, "list the engine's layers and tactics");
  sub->add_option("--backend", o->backend,
                  "models: check that every layer has a kernel on auto (best present), cpu or "
                  "cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--profile", o->profiles,
                  "models: NAME:MIN,OPT,MAX per dynamic input for the kernel check (as build's)")
      ->take_all();
  sub->add_flag("--no-kernels", o->no_kernels,
                "models: skip the kernel check (import-level checks only)");
  sub->footer(
      "Exit code: 0 when everything is supported, 1 when the model has unsupported ops (subgraphs "
      "of If, Loop and Scan included) or a layer without a kernel on the backend, or is "
      "malformed (a cycle, an undefined value, bad external data: what `kiln build` refuses) or "
      "the file is bad.");
  return [o]() { return o->path.ends_with(".onnx") ? InspectOnnx(*o) : InspectEngine(*o); };
}

}  // namespace
KILN_REGISTER_COMMAND(inspect, 5, Setup);
}  // namespace kiln::cli
