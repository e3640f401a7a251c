// ConvTranspose on the CPU (1-D, 2-D and 3-D): per image and group, col = W_g^T x X_g (one sgemm,
// Mg*kd*kh*kw x ID*IH*IW), then col2im scatters col into Y (initialised with the bias). 1-D and 2-D
// are 3-D with depth (and height) 1.
// Tactics: f32-convtranspose-cpu-gemm-col2im-openblas and ...-blocked-8x8.
#include <algorithm>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"

namespace kiln::cpu {
namespace {

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

struct DeconvGeometry {
  int64_t n = 0, group = 1, cg = 0, mg = 0;
  int64_t id = 1, od = 1, kd = 1, sd = 1, dd = 1, pd = 0;  // depth (3-D only)
  int64_t ih = 1, iw = 1, oh = 1, ow = 1, kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t ph = 0, pw = 0;
  int64_t InVolume() const { return id * ih * iw; }
  int64_t OutVolume() const { return od * oh * ow; }
  int64_t Rows() const { return mg * kd * kh * kw; }
};

StatusOr<DeconvGeometry> ResolveDeconv(const nn::WindowAttrs& a, std::span<const int64_t> x,
                                       std::span<const int64_t> w, std::span<const int64_t> y) {
  size_t r = a.kernel.size();
  if (x.size() != r + 2 || w.size() != r + 2 || r < 1 || r > 3) {
    return MakeError(ErrorCode::kShapeMismatch, "ConvTranspose operand ranks do not match");
  }
  DeconvGeometry g;
  g.n = x[0];
  g.group = a.group;
  g.cg = x[1] / a.group;
  g.mg = w[1];
  if (w[0] != x[1] || x[1] % a.group != 0) {
    return MakeError(ErrorCode::kShapeMismatch, "ConvTranspose channels do not match the weight");
  }
  auto axis = [&](size_t i, int64_t& in, int64_t& out, int64_t& k, int64_t& s, int64_t& d,
                  int64_t& p) {
    in = x[i + 2];
    out = nn::TransposeOutDim<int64_t>(in, a, i);
    k = a.kernel[i];
    s = a.strides[i];
    d = a.dilations[i];
    p = nn::TransposePadBegin(in, out, a, i);
  };
  if (r == 3) axis(0, g.id, g.od, g.kd, g.sd, g.dd, g.pd);
  if (r >= 2) axis(r - 2, g.ih, g.oh, g.kh, g.sh, g.dh, g.ph);
  axis(r - 1, g.iw, g.ow, g.kw, g.sw, g.dw, g.pw);
  if (!y.empty() && (y[0] != g.n || y[1] != g.mg * g.group || y[r + 1] != g.ow ||
                     (r >= 2 && y[r] != g.oh) || (r == 3 && y[2] != g.od))) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "ConvTranspose output dims do not match the attributes");
  }
  return g;
}

class ConvTransposeKernel final : public Kernel {
 public:
  ConvTransposeKernel(nn::WindowAttrs attrs, GemmImpl impl)
      : attrs_(std::move(attrs)), impl_(impl) {}

  static size_t Workspace(const DeconvGeometry& g, GemmImpl impl) {
    int64_t rows = g.Rows(), cols = g.InVolume();
    return Align64(static_cast<size_t>(rows * cols) * 4) +
           SgemmWorkspaceBytes(impl, rows, cols, g.cg);
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(g_,
                          ResolveDeconv(attrs_, inputs[0].dims, inputs[1].dims, outputs[0].dims));
    return Workspace(g_, impl_);
  }

  Status Run(const KernelRunArgs& args) override {
    const DeconvGeometry& g = g_;
    const float* x = args.inputs[0].as<const float>();
    const float* w = args.inputs[1].as<const float>();
    const float* bias = args.inputs.size() > 2 ? args.inputs[2].as<const float>() : nullptr;
    float* y = args.outputs[0].as<float>();
    int64_t rows = g.Rows(), ihw = g.InVolume(), ohw = g.OutVolume();
    int64_t m = g.mg * g.group, c = g.cg * g.group;
    auto* col = static_cast<float*>(args.workspace);
    void* gemm_ws =
        static_cast<std::byte*>(args.workspace) + Align64(static_cast<size_t>(rows * ihw) * 4);
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t grp = 0; grp < g.group; ++grp) {
        // W is [C, Mg, (kd,) kh, kw]: group grp's slice is a Cg x rows matrix; we need its
        // transpose.
        const float* wg = w + grp * g.cg * rows;
        const float* xg = x + (n * c + grp * g.cg) * ihw;
        float* yg = y + (n * m + grp * g.mg) * ohw;
        Sgemm(impl_, true, false, rows, ihw, g.cg, 1.f, wg, rows, xg, ihw, 0.f, col, ihw, gemm_ws);
        // col2im: each output channel is independent, so channels run in parallel.
        ThreadPool::Default().ParallelFor(g.mg, [&](int64_t c0, int64_t c1) {
          for (int64_t oc = c0; oc < c1; ++oc) {
            float* plane = yg + oc * ohw;
            float b = bias ? bias[grp * g.mg + oc] : 0.f;
            std::fill(plane, plane + ohw, b);
            for (int64_t kz = 0; kz < g.kd; ++kz) {
              for (int64_t ky = 0; ky < g.kh; ++ky) {
                for (int64_t kx = 0; kx < g.kw; ++kx) {
                  const float* src = col + (((oc * g.kd + kz) * g.kh + ky) * g.kw + kx) * ihw;
                  for (int64_t iz = 0; iz < g.id; ++iz) {
                    const int64_t oz = iz * g.sd - g.pd + kz * g.dd;
                    if (oz < 0 || oz >= g.od) continue;
                    for (int64_t ih = 0; ih < g.ih; ++ih) {
                      int64_t oh = ih * g.sh - g.ph + ky * g.dh;
                      if (oh < 0 || oh >= g.oh) continue;
                      float* dst = plane + (oz * g.oh + oh) * g.ow;
                      const float* s = src + (iz * g.ih + ih) * g.iw;
                      for (int64_t iw = 0; iw < g.iw; ++iw) {
                        int64_t ow = iw * g.sw - g.pw + kx * g.dw;
                        if (ow >= 0 && ow < g.ow) dst[ow] += s[iw];
                      }
                    }
                  }
                }
              }
            }
          }
        });
      }
    }
    return OkStatus();
  }

 private:
  nn::WindowAttrs attrs_;
  GemmImpl impl_;
  DeconvGeometry g_;
};

StatusOr<nn::WindowAttrs> ReadDeconvAttrs(const KernelRequest& request) {
  size_t rank = request.inputs[0].shape.size();
  auto w = StaticDims(request.inputs[1].shape);
  if (rank < 3 || rank > 5 || !w || w->size() != rank) {
    return MakeError(ErrorCode::kUnimplemented,
                     "node '{}': the CPU backend runs 1-D, 2-D and 3-D ConvTranspose with static "
                     "weights",
                     request.node->name());
  }
  auto a = nn::ReadWindowAttrs(request.node->attrs(), rank - 2,
                               std::vector<int64_t>(w->begin() + 2, w->end()));
  if (!a.ok()) {
    return MakeError(a.status().code(), "node '{}': {}", request.node->name(),
                     a.status().message());
  }
  return a;
}

class ConvTransposeProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override { return "cpu.convtranspose"; }
  std::string_view op_type() const override { return "ConvTranspose"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    auto a = ReadDeconvAttrs(request);
    if (!a.ok()) return {};
    auto g = ResolveDeconv(*a, MaxDimsOf(request.inputs[0]), MaxDimsOf(request.inputs[1]), {});
    if (!g.ok()) return {};
    return {{"f32-convtranspose-cpu-gemm-col2im-openblas",
             {0},
             ConvTransposeKernel::Workspace(*g, GemmImpl::kOpenBlas)},
            {"f32-convtranspose-cpu-gemm-col2im-blocked-8x8",
             {1},
             ConvTransposeKernel::Workspace(*g, GemmImpl::kBlocked8x8)}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(nn::WindowAttrs a, ReadDeconvAttrs(request));
    if (tactic.params.size() != 1 || tactic.params[0] < 0 || tactic.params[0] > 1) {
      return MakeError(ErrorCode::kInvalidArgument, "{}: tactic '{}' has invalid params", id(),
                       tactic.name);
    }
    return std::unique_ptr<Kernel>(std::make_unique<ConvTransposeKernel>(
        std::move(a), static_cast<GemmImpl>(tactic.params[0])));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(ConvTransposeProvider);

}  // namespace
}  // namespace kiln::cpu
