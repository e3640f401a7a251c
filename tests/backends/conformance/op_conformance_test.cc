// The op conformance suite: every case of every family table (op_cases.h) on every backend built
// into this kiln. MatchesReference runs each provider and tactic of the backend on fresh random
// inputs in every float storage type of the case and compares with the reference (the CPU
// backend's first tactic where the case has no reference of its own); it skips where the backend
// cannot run here (no GPU). OpTactics.OfferedWithoutADevice runs without a device: each `must`
// case's request gets a tactic from some provider of the backend in every float type it runs in.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/backends/kernel.h"
#include "op_cases.h"

namespace kiln::testing {
namespace {

std::vector<OpCase> AllCases() {
  std::vector<OpCase> all;
  for (auto family :
       {ElementwiseCases, NnCases, ReduceCases, TensorCases, MatmulCases, QuantizeCases}) {
    for (OpCase& c : family()) all.push_back(std::move(c));
  }
  return all;
}

// The backends this kiln has kernels for (registration is static: no device needed to list them).
std::vector<BackendKind> BuiltBackends() {
  std::vector<BackendKind> out = {BackendKind::kCpu};
#if KILN_TEST_CUDA_BUILT
  out.push_back(BackendKind::kCuda);
#endif
  return out;
}

using Param = std::tuple<BackendKind, OpCase>;

class OpConformance : public ::testing::TestWithParam<Param> {};

TEST_P(OpConformance, MatchesReference) {
  const auto& [backend, c] = GetParam();
  OpTester t = c.make();
  const int runs = t.Run(backend);
  if (::testing::Test::IsSkipped()) return;
  if (c.required) {
    EXPECT_GT(runs, 0) << c.name << ": no " << ToString(backend) << " tactic ran";
  }
}

// Only the `must` cases: a backend is checked on the others where it has a tactic.
std::vector<OpCase> RequiredCases() {
  std::vector<OpCase> out;
  for (OpCase& c : AllCases()) {
    if (c.required) out.push_back(std::move(c));
  }
  return out;
}

class OpTactics : public ::testing::TestWithParam<Param> {};

TEST_P(OpTactics, OfferedWithoutADevice) {
  const auto& [backend, c] = GetParam();
  const OpTester t = c.make();
  for (DataType ft : t.float_types()) {
    SCOPED_TRACE(std::string(ToString(ft)));
    auto layer = t.Request(ft);
    ASSERT_TRUE(layer.ok()) << layer.status().ToString();
    bool offered = false;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(backend, t.op_type())) {
      offered = offered || !p->Tactics((*layer)->request).empty();
    }
    EXPECT_TRUE(offered) << c.name << ": no " << ToString(backend) << " tactic";
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return std::string(ToString(std::get<0>(info.param))) + "_" +
         CaseTestName(std::get<1>(info.param).name);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpConformance,
                         ::testing::Combine(::testing::ValuesIn(BuiltBackends()),
                                            ::testing::ValuesIn(AllCases())),
                         ParamName);
INSTANTIATE_TEST_SUITE_P(Ops, OpTactics,
                         ::testing::Combine(::testing::ValuesIn(BuiltBackends()),
                                            ::testing::ValuesIn(RequiredCases())),
                         ParamName);

}  // namespace
}  // namespace kiln::testing
