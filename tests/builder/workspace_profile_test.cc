// The builder plans each layer's workspace for the whole profile, not only its max shapes: a
// kernel may ask for more at a smaller shape (cuDNN picks its internal algorithm per shape; the
// H200 run of session 10 hit KILN-E5004 with ResNet-50 built for batch 1/8/32 and run at 8).
// A test-only Neg kernel here asks for 64 KiB / batch, so the min shape needs the most.
#include <gtest/gtest.h>

#include "kiln/backends/backend.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/builder/builder.h"
#include "kiln/runtime/runtime.h"

namespace kiln {
namespace {

constexpr size_t kBytesAtBatchOne = 64 << 10;

class MoreWorkspaceWhenSmallProvider final : public cpu::CpuFloatProvider {
 public:
  // Sorts before the CPU backend's own Neg, so the heuristic (untimed) build takes it.
  std::string_view id() const override { return "0test.neg_more_workspace_when_small"; }
  std::string_view op_type() const override { return "Neg"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest&) const override {
    return {{"f32-neg-cpu-test-more-workspace-when-small", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest&,
                                              const TacticConfig&) const override {
    auto prepare = [](std::span<const TensorView> in,
                      std::span<const TensorView>) -> StatusOr<size_t> {
      return kBytesAtBatchOne / static_cast<size_t>(std::max<int64_t>(1, in[0].dims[0]));
    };
    auto run = [](const KernelRunArgs& a) -> Status {
      const size_t need = kBytesAtBatchOne / static_cast<size_t>(a.inputs[0].dims[0]);
      if (a.workspace_bytes < need) {
        return MakeError(ErrorCode::kKernelFailed, "workspace has {} bytes, {} needed",
                         a.workspace_bytes, need);
      }
      const float* x = a.inputs[0].as<const float>();
      float* y = a.outputs[0].as<float>();
      for (int64_t i = 0; i < a.outputs[0].num_elements(); ++i) y[i] = -x[i];
      return OkStatus();
    };
    return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(run, prepare));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(MoreWorkspaceWhenSmallProvider);

TEST(BuilderWorkspace, PlansTheMostAnyProfileShapeAsksFor) {
  auto graph = std::make_unique<Graph>();
  Value* x = graph->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 8});
  Value* y = graph->AddValue("y", DataType::kFloat32);
  graph->AddNode("Neg", "neg", {x}, {y});
  graph->MarkOutput(y);
  BuilderConfig config;
  config.search_tactics = false;  // the heuristic's (first) tactic: the test provider's
  ASSERT_TRUE(ParseProfileSpec("x:1x8,4x8,16x8", &config.profile).ok());
  BuildReport report;
  auto desc = BuildEngine({std::move(graph), "neg", HashString("neg")}, config, &report);
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  ASSERT_EQ((*desc)->layers.size(), 1u);
  ASSERT_EQ((*desc)->layers[0].tactic.name, "f32-neg-cpu-test-more-workspace-when-small");
  // At the max shape (16) the kernel asks for 4 KiB; at the min (1), 64 KiB.
  EXPECT_GE((*desc)->plan.workspace_bytes, static_cast<int64_t>(kBytesAtBatchOne));

  auto backend = GetBackend(BackendKind::kCpu);
  ASSERT_TRUE(backend.ok());
  auto engine = Engine::Create(std::shared_ptr<const EngineDesc>(std::move(*desc)), *backend);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto ctx = (*engine)->CreateExecutionContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  for (int64_t n : {16, 4, 1, 3}) {
    SCOPED_TRACE(n);
    std::vector<float> in(static_cast<size_t>(n * 8)), out(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = 0.25f * static_cast<float>(i) - 3.0f;
    ASSERT_TRUE((*ctx)->SetInputShape("x", {n, 8}).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("x", in.data()).ok());
    ASSERT_TRUE((*ctx)->SetTensorAddress("y", out.data()).ok());
    Status s = (*ctx)->Execute();
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], -in[i]) << i;
  }
}

}  // namespace
}  // namespace kiln
