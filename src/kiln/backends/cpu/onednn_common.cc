// Shared oneDNN helpers for the CPU kernels.
#include "kiln/backends/cpu/onednn_common.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>

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
    case FusedActivation::kSwish:  // x * sigmoid(alpha * x)
      *alpha = act.min;
      return dnnl::algorithm::eltwise_swish;
    case FusedActivation::kGelu:
      return dnnl::algorithm::eltwise_gelu_erf;
    case FusedActivation::kGeluTanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
  }
  return std::nullopt;
}

OneDnnConvShapes MakeOneDnnConvShapes(const ConvSpec& spec, const ConvGeometry& g) {
  using Tag = dnnl::memory::format_tag;
  using Dims = dnnl::memory::dims;
  OneDnnConvShapes s;
  if (spec.spatial_rank == 2) {
    s.src = {g.n, g.cg * g.group, g.ih, g.iw};
    s.dst = {g.n, g.mg * g.group, g.oh, g.ow};
    s.wei = g.group > 1 ? Dims{g.group, g.mg, g.cg, g.kh, g.kw} : Dims{g.mg, g.cg, g.kh, g.kw};
    s.strides = {g.sh, g.sw};
    s.dilation = {g.dh - 1, g.dw - 1};
    s.pad_l = {g.ph, g.pw};
    s.pad_r = {g.pad_h_end, g.pad_w_end};
    s.act_tag = Tag::nchw;
    s.wei_tag = g.group > 1 ? Tag::goihw : Tag::oihw;
  } else {  // 1-D: drop the unit height
    s.src = {g.n, g.cg * g.group, g.iw};
    s.dst = {g.n, g.mg * g.group, g.ow};
    s.wei = g.group > 1 ? Dims{g.group, g.mg, g.cg, g.kw} : Dims{g.mg, g.cg, g.kw};
    s.strides = {g.sw};
    s.dilation = {g.dw - 1};
    s.pad_l = {g.pw};
    s.pad_r = {g.pad_w_end};
    s.act_tag = Tag::ncw;
    s.wei_tag = g.group > 1 ? Tag::goiw : Tag::oiw;
  }
  return s;
}

dnnl::memory::data_type Int8ComputeType() {
  static const dnnl::memory::data_type type = [] {
    if (const char* e = std::getenv("KILN_CPU_INT8_F32"); e && *e) {
      return std::strcmp(e, "0") == 0 ? dnnl::memory::data_type::s8 : dnnl::memory::data_type::f32;
    }
    using dnnl::cpu_isa;
    const cpu_isa isa = dnnl::get_effective_cpu_isa();
    const bool vnni = isa == cpu_isa::avx2_vnni || isa == cpu_isa::avx512_core_vnni ||
                      isa == cpu_isa::avx512_core_bf16 || isa == cpu_isa::avx512_core_amx;
    return vnni ? dnnl::memory::data_type::s8 : dnnl::memory::data_type::f32;
  }();
  return type;
}

void SetOneDnnThreads() { omp_set_num_threads(ThreadPool::Default().size()); }

OneDnnSingleThreadScope::OneDnnSingleThreadScope() : previous_(omp_get_max_threads()) {
  omp_set_num_threads(1);
}

OneDnnSingleThreadScope::~OneDnnSingleThreadScope() { omp_set_num_threads(previous_); }

}  // namespace kiln::cpu
