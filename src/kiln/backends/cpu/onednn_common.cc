// Shared oneDNN helpers for the CPU kernels.
#include "kiln/backends/cpu/onednn_common.h"

#include <omp.h>

#include "kiln/core/thread_pool.h"

namespace kiln::cpu {

dnnl::engine& OneDnnEngine() {
  // Leaked on purpose: primitives held by static kernels may outlive a destroyed engine.
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

std::optional<dnnl::algorithm> OneDnnEltwise(const FusedActivationSpec& act, float* alpha,
                                             float* beta) {
  *alpha = 0.f;
  *beta = 0.f;
  switch (act.kind) {
    case FusedActivation::kNone:
      return std::nullopt;
    case FusedActivation::kRelu:
      return dnnl::algorithm::eltwise_relu;
    case FusedActivation::kClip:
      *alpha = act.min;
      *beta = act.max;
      return dnnl::algorithm::eltwise_clip;
    case FusedActivation::kSigmoid:
      return dnnl::algorithm::eltwise_logistic;
    case FusedActivation::kHardSwish:
      return dnnl::algorithm::eltwise_hardswish;
    case FusedActivation::kSilu:
      *alpha = 1.f;
      return dnnl::algorithm::eltwise_swish;
    case FusedActivation::kGelu:
      return dnnl::algorithm::eltwise_gelu_erf;
    case FusedActivation::kGeluTanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
  }
  return std::nullopt;
}

void SetOneDnnThreads() { omp_set_num_threads(ThreadPool::Default().size()); }

OneDnnSingleThreadScope::OneDnnSingleThreadScope() : previous_(omp_get_max_threads()) {
  omp_set_num_threads(1);
}

OneDnnSingleThreadScope::~OneDnnSingleThreadScope() { omp_set_num_threads(previous_); }

}  // namespace kiln::cpu
