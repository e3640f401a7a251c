// 3-D convolution on the CPU: Conv and FusedConv with rank-5 operands (N, C, D, H, W), as video
// models use them (R3D-18, S3D, X3D). One tactic:
//   f32-conv3d-cpu-vol2col-openblas   per image, group and output depth plane: the plane's
//                                     vol2col (rows C/g * kd * kh * kw, columns OH * OW) and one
//                                     OpenBLAS sgemm, then FusedConv's bias, residual and
//                                     activation on that plane while it is in cache.
// Groups, strides, dilations, explicit and automatic padding; the workspace holds one plane's
// columns, not the whole volume's.
#include <algorithm>
#include <array>
#include <cstring>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"

namespace kiln::cpu {
namespace {

constexpr size_t kSpatial = 3;

struct Conv3dGeometry {
  int64_t n = 0, group = 1, cg = 0, mg = 0;  // batch, groups, in/out channels per group
  // Per spatial axis (depth, height, width): input and output extents, kernel, stride,
  // dilation and begin padding.
  std::array<int64_t, kSpatial> in{}, out{}, k{}, s{}, d{}, p{};
  int64_t InVolume() const { return in[0] * in[1] * in[2]; }
  int64_t OutPlane() const { return out[1] * out[2]; }
  int64_t OutVolume() const { return out[0] * OutPlane(); }
  int64_t Rows() const { return cg * k[0] * k[1] * k[2]; }  // the GEMM's K
};

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

StatusOr<ConvSpec> ReadConv3dSpec(const KernelRequest& request) {
  return ReadConvSpec(request, kSpatial, kSpatial);
}

StatusOr<Conv3dGeometry> ResolveConv3d(const ConvSpec& spec, std::span<const int64_t> x,
                                       std::span<const int64_t> w, std::span<const int64_t> y) {
  const nn::WindowAttrs& a = spec.attrs;
  if (x.size() != kSpatial + 2 || w.size() != kSpatial + 2) {
    return MakeError(ErrorCode::kShapeMismatch, "3-D conv operands have ranks {} and {}", x.size(),
                     w.size());
  }
  Conv3dGeometry g;
  g.n = x[0];
  g.group = a.group;
  g.cg = w[1];
  if (a.group < 1 || w[0] % a.group != 0 || x[1] != g.cg * a.group) {
    return MakeError(ErrorCode::kShapeMismatch, "conv input has {} channels; weight expects {}",
                     x[1], g.cg * a.group);
  }
  g.mg = w[0] / a.group;
  for (size_t i = 0; i < kSpatial; ++i) {
    g.in[i] = x[2 + i];
    g.out[i] = nn::WindowOutDim<int64_t>(g.in[i], a, i);
    g.k[i] = a.kernel[i];
    g.s[i] = a.strides[i];
    g.d[i] = a.dilations[i];
    g.p[i] = nn::WindowPadBegin(g.in[i], g.out[i], a, i);
    if (g.out[i] < 1) return MakeError(ErrorCode::kShapeMismatch, "conv output would be empty");
  }
  if (!y.empty()) {
    const bool ok = y.size() == kSpatial + 2 && y[0] == g.n && y[1] == w[0] && y[2] == g.out[0] &&
                    y[3] == g.out[1] && y[4] == g.out[2];
    if (!ok) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "conv output dims do not match the attributes (expected {} x {} x {} x {} "
                       "x {})",
                       g.n, w[0], g.out[0], g.out[1], g.out[2]);
    }
  }
  return g;
}

// The im2col rows of output depth plane `od` for one image and group: row r = (c, kz, ky, kx),
// column oy * OW + ox; zero where the window reads padding.
void Vol2ColPlane(const Conv3dGeometry& g, const float* x, int64_t od, float* col) {
  const int64_t plane = g.OutPlane();
  const int64_t taps = g.k[0] * g.k[1] * g.k[2];
  ThreadPool::Default().ParallelFor(
      g.Rows(),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t c = r / taps, t = r % taps;
          const int64_t kz = t / (g.k[1] * g.k[2]), ky = (t / g.k[2]) % g.k[1], kx = t % g.k[2];
          float* dst = col + r * plane;
          const int64_t iz = od * g.s[0] - g.p[0] + kz * g.d[0];
          if (iz < 0 || iz >= g.in[0]) {
            std::memset(dst, 0, static_cast<size_t>(plane) * sizeof(float));
            continue;
          }
          const float* src = x + (c * g.in[0] + iz) * g.in[1] * g.in[2];
          for (int64_t oy = 0; oy < g.out[1]; ++oy) {
            const int64_t iy = oy * g.s[1] - g.p[1] + ky * g.d[1];
            float* row = dst + oy * g.out[2];
            if (iy < 0 || iy >= g.in[1]) {
              std::memset(row, 0, static_cast<size_t>(g.out[2]) * sizeof(float));
              continue;
            }
            const float* srow = src + iy * g.in[2];
            for (int64_t ox = 0; ox < g.out[2]; ++ox) {
              const int64_t ix = ox * g.s[2] - g.p[2] + kx * g.d[2];
              row[ox] = ix >= 0 && ix < g.in[2] ? srow[ix] : 0.f;
            }
          }
        }
      },
      4);
}

class Conv3dKernel final : public Kernel {
 public:
  explicit Conv3dKernel(ConvSpec spec) : spec_(std::move(spec)) {}

  static size_t Workspace(const Conv3dGeometry& g) {
    return Align64(static_cast<size_t>(g.Rows() * g.OutPlane()) * sizeof(float)) +
           SgemmWorkspaceBytes(GemmImpl::kOpenBlas, g.mg, g.OutPlane(), g.Rows());
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(geo_,
                          ResolveConv3d(spec_, inputs[0].dims, inputs[1].dims, outputs[0].dims));
    return Workspace(geo_);
  }

  Status Run(const KernelRunArgs& args) override {
    const Conv3dGeometry& g = geo_;
    const float* x = args.inputs[0].as<const float>();
    const float* w = args.inputs[1].as<const float>();
    const float* bias = args.inputs.size() > 2 ? args.inputs[2].as<const float>() : nullptr;
    const float* z = args.inputs.size() > 3 ? args.inputs[3].as<const float>() : nullptr;
    float* y = args.outputs[0].as<float>();
    const int64_t rows = g.Rows(), plane = g.OutPlane(), ovol = g.OutVolume();
    const int64_t m = g.mg * g.group, c = g.cg * g.group;
    auto* col = static_cast<float*>(args.workspace);
    void* gemm_ws = static_cast<std::byte*>(args.workspace) +
                    Align64(static_cast<size_t>(rows * plane) * sizeof(float));
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t grp = 0; grp < g.group; ++grp) {
        const float* xg = x + (n * c + grp * g.cg) * g.InVolume();
        const float* wg = w + grp * g.mg * rows;
        float* yg = y + (n * m + grp * g.mg) * ovol;
        const float* zg = z ? z + (n * m + grp * g.mg) * ovol : nullptr;
        const float* bg = bias ? bias + grp * g.mg : nullptr;
        for (int64_t od = 0; od < g.out[0]; ++od) {
          Vol2ColPlane(g, xg, od, col);
          float* yp = yg + od * plane;
          Sgemm(GemmImpl::kOpenBlas, false, false, g.mg, plane, rows, 1.f, wg, rows, col, plane,
                0.f, yp, ovol, gemm_ws);
          if (zg || bg || spec_.act.kind != FusedActivation::kNone) {
            ThreadPool::Default().ParallelFor(g.mg, [&](int64_t r0, int64_t r1) {
              ApplyEpilogue(yp + r0 * ovol, r1 - r0, plane, ovol, bg ? bg + r0 : nullptr, nullptr,
                            zg ? zg + r0 * ovol + od * plane : nullptr, spec_.act);
            });
          }
        }
      }
    }
    return OkStatus();
  }

 private:
  ConvSpec spec_;
  Conv3dGeometry geo_;
};

class Conv3dProviderBase : public CpuFloatProvider {
 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    auto spec = ReadConv3dSpec(request);
    if (!spec.ok()) return {};
    const std::vector<int64_t> x = MaxDimsOf(request.inputs[0]);
    const std::vector<int64_t> w = MaxDimsOf(request.inputs[1]);
    if (x.empty() || w.empty()) return {};
    auto g = ResolveConv3d(*spec, x, w, {});
    if (!g.ok()) return {};
    return {{"f32-conv3d-cpu-vol2col-openblas", {}, Conv3dKernel::Workspace(*g)}};
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig&) const override {
    KILN_ASSIGN_OR_RETURN(ConvSpec spec, ReadConv3dSpec(request));
    return std::unique_ptr<Kernel>(std::make_unique<Conv3dKernel>(std::move(spec)));
  }
};

class Conv3dProvider final : public Conv3dProviderBase {
 public:
  std::string_view id() const override { return "cpu.conv3d"; }
  std::string_view op_type() const override { return "Conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Conv3dProvider);

class FusedConv3dProvider final : public Conv3dProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_conv3d"; }
  std::string_view op_type() const override { return "FusedConv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(FusedConv3dProvider);

}  // namespace
}  // namespace kiln::cpu
