// Helpers for pass tests: build small graphs tersely, make random inputs and compare a graph's
// outputs before and after passes with the CPU reference evaluator.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/ir/graph.h"
#include "kiln/passes/pass.h"

namespace kiln::passes::testing {

inline Tensor RandomTensor(DataType dtype, const std::vector<int64_t>& dims, uint32_t seed,
                           double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  Tensor t(dtype, dims);
  std::uniform_real_distribution<double> uni(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    double x = uni(rng);
    if (dtype == DataType::kBool) x = x > 0 ? 1 : 0;
    if (IsInteger(dtype)) x = std::floor(x);
    StoreFromDouble(t.view(), i, x);
  }
  return t;
}

inline Tensor Scalar(float v) { return Tensor::FromVector<float>(DataType::kFloat32, {}, {v}); }
inline Tensor Ints(std::vector<int64_t> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return Tensor::FromVector<int64_t>(DataType::kInt64, {n}, v);
}

// Adds `op` with one fresh output; returns the output.
inline Value* Op(Graph& g, const std::string& op, std::vector<Value*> inputs,
                 AttributeMap attrs = {}) {
  Value* out = g.AddValue(g.UniqueName(op + "_out"));
  g.AddNode(op, g.UniqueName(op), std::move(inputs), {out}, std::move(attrs));
  return out;
}
inline Value* Const(Graph& g, Tensor t) { return g.AddConstant(g.UniqueName("c"), std::move(t)); }

template <typename... KV>
AttributeMap Attrs(KV&&... kv) {
  AttributeMap m;
  (m.Set(kv.first, kv.second), ...);
  return m;
}

// The first node of op `op`, or nullptr.
inline Node* Find(const Graph& g, const std::string& op) {
  for (Node* n : g.nodes()) {
    if (n->op_type() == op) return n;
  }
  return nullptr;
}

inline int CountOps(const Graph& g, const std::string& op) {
  int n = 0;
  for (Node* node : g.nodes()) n += node->op_type() == op;
  return n;
}

// Random values for every graph input; symbolic dims take `bindings`.
inline std::map<std::string, Tensor> RandomInputs(const Graph& g,
                                                  const std::map<std::string, int64_t>& bindings,
                                                  uint32_t seed) {
  std::map<std::string, Tensor> out;
  for (Value* in : g.inputs()) {
    std::vector<int64_t> dims;
    for (const Dim& d : in->shape()) dims.push_back(d.Substitute(bindings).value());
    out[in->name()] = RandomTensor(in->dtype(), dims, seed++, -2.0, 2.0);
  }
  return out;
}

inline PassOptions TestOptions() {
  PassOptions o;
  o.evaluator = [](const Node& n, std::span<const Tensor* const> in) {
    return cpu::EvaluateNode(n, in);
  };
  return o;
}

// TestOptions with the layout pass on, as the builder sets it for CUDA in FP16/BF16.
inline PassOptions NhwcOptions() {
  PassOptions o = TestOptions();
  o.conv_layout = "NHWC";
  return o;
}

// Runs `passes` (a fresh PassManager) over `g`; fails the test on error.
inline PassReport RunPasses(Graph& g, std::vector<std::unique_ptr<Pass>> passes,
                            PassOptions options = TestOptions()) {
  PassManager pm(std::move(options));
  for (auto& p : passes) pm.Add(std::move(p));
  auto r = pm.Run(g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : PassReport{};
}

// Evaluates both graphs on the same random inputs and expects every output to agree within
// `rel` of the output's largest magnitude (at least 1).
inline void ExpectSameOutputs(const Graph& before, const Graph& after,
                              const std::map<std::string, int64_t>& bindings = {},
                              double rel = 1e-5, uint32_t seed = 7) {
  auto inputs = RandomInputs(before, bindings, seed);
  auto a = cpu::EvaluateGraph(before, inputs);
  ASSERT_TRUE(a.ok()) << "before: " << a.status().ToString();
  auto b = cpu::EvaluateGraph(after, inputs);
  ASSERT_TRUE(b.ok()) << "after: " << b.status().ToString();
  ASSERT_EQ(a->size(), b->size());
  for (const auto& [name, ta] : *a) {
    ASSERT_TRUE(b->count(name)) << "output '" << name << "' vanished";
    const Tensor& tb = b->at(name);
    ASSERT_EQ(ta.dims(), tb.dims()) << name;
    double scale = 1.0, diff = 0.0;
    for (int64_t i = 0; i < ta.num_elements(); ++i) {
      scale = std::max(scale, std::abs(ta.GetDouble(i)));
      diff = std::max(diff, std::abs(ta.GetDouble(i) - tb.GetDouble(i)));
    }
    EXPECT_LE(diff, rel * scale) << "output '" << name << "' differs after the passes";
  }
}

}  // namespace kiln::passes::testing
