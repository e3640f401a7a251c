// Conv and FusedConv on the CPU (1-D and 2-D), with real alternatives for the builder's search:
//   f32-conv-cpu-direct-dw{kh}x{kw}       depthwise direct loops, no workspace
//   f32-conv-cpu-1x1-gemm                 1x1/stride 1/no pad: one sgemm per image, no im2col
//   f32-conv-cpu-onednn                   oneDNN's convolution primitive (conv_onednn.cc)
//   f32-conv-cpu-im2col-openblas          im2col of the whole image + one OpenBLAS sgemm
//   f32-conv-cpu-im2col-openblas-rows{R}  im2col in chunks of R output rows: bounded workspace
//   f32-conv-cpu-im2col-blocked-8x8       im2col + kiln's blocked sgemm (no BLAS threads)
// Bias, the FusedConv residual and activation are applied per chunk while it is in cache.
#include <algorithm>
#include <cstring>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"

#pragma GCC optimize("fp-contract=fast")

namespace kiln::cpu {
namespace {

enum class ConvAlgo : int64_t { kIm2col = 0, kOneByOne = 1, kDepthwise = 2, kOneDnn = 3 };

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

// Copies the im2col rows for output rows [oh0, oh1) of one image and group into col
// (K x (oh1 - oh0) * OW, row-major). Zero where the window reads padding.
void Im2Col(const ConvGeometry& g, const float* x, int64_t oh0, int64_t oh1, float* col) {
  int64_t ncols = (oh1 - oh0) * g.ow;
  int64_t k = g.cg * g.kh * g.kw;
  ThreadPool::Default().ParallelFor(
      k,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          int64_t c = r / (g.kh * g.kw), ky = (r / g.kw) % g.kh, kx = r % g.kw;
          const float* plane = x + c * g.ih * g.iw;
          float* dst = col + r * ncols;
          // Valid output columns for this kx: 0 <= ow*sw - pw + kx*dw < iw.
          int64_t off = kx * g.dw - g.pw;
          int64_t lo = std::clamp<int64_t>(off >= 0 ? 0 : (-off + g.sw - 1) / g.sw, 0, g.ow);
          int64_t hi =
              std::clamp<int64_t>(g.iw - 1 - off < 0 ? 0 : (g.iw - 1 - off) / g.sw + 1, lo, g.ow);
          for (int64_t oh = oh0; oh < oh1; ++oh, dst += g.ow) {
            int64_t ih = oh * g.sh - g.ph + ky * g.dh;
            if (ih < 0 || ih >= g.ih) {
              std::memset(dst, 0, g.ow * sizeof(float));
              continue;
            }
            const float* src = plane + ih * g.iw + off;
            for (int64_t ow = 0; ow < lo; ++ow) dst[ow] = 0.f;
            if (g.sw == 1) {
              std::memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * g.sw];
            }
            for (int64_t ow = hi; ow < g.ow; ++ow) dst[ow] = 0.f;
          }
        }
      },
      4);
}

// Depthwise (one input channel per group): each output plane is a sum of kh*kw shifted input
// rows, vectorised along the output row.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void DepthwisePlane(
    const ConvGeometry& g, const float* x, const float* w, float bias, float* y) {
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    float* yrow = y + oh * g.ow;
    for (int64_t ow = 0; ow < g.ow; ++ow) yrow[ow] = bias;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      int64_t ih = oh * g.sh - g.ph + ky * g.dh;
      if (ih < 0 || ih >= g.ih) continue;
      const float* xrow = x + ih * g.iw;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        float wv = w[ky * g.kw + kx];
        int64_t off = kx * g.dw - g.pw;
        int64_t lo = std::clamp<int64_t>(off >= 0 ? 0 : (-off + g.sw - 1) / g.sw, 0, g.ow);
        int64_t hi =
            std::clamp<int64_t>(g.iw - 1 - off < 0 ? 0 : (g.iw - 1 - off) / g.sw + 1, lo, g.ow);
        const float* src = xrow + off;
        if (g.sw == 1) {
          for (int64_t ow = lo; ow < hi; ++ow) yrow[ow] += wv * src[ow];
        } else {
          for (int64_t ow = lo; ow < hi; ++ow) yrow[ow] += wv * src[ow * g.sw];
        }
      }
    }
  }
}

class ConvKernel final : public Kernel {
 public:
  ConvKernel(ConvSpec spec, ConvAlgo algo, GemmImpl impl, int64_t rows_per_chunk)
      : spec_(std::move(spec)), algo_(algo), impl_(impl), rows_per_chunk_(rows_per_chunk) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(
        geo_, ResolveConvGeometry(spec_, inputs[0].dims, inputs[1].dims, outputs[0].dims));
    const ConvGeometry& g = geo_;
    if (algo_ == ConvAlgo::kDepthwise && g.cg != 1) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "direct depthwise tactic on a non-depthwise conv");
    }
    if (algo_ == ConvAlgo::kOneByOne &&
        (g.kh != 1 || g.kw != 1 || g.sh != 1 || g.sw != 1 || g.ph != 0 || g.pw != 0 ||
         g.pad_h_end != 0 || g.pad_w_end != 0)) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "1x1 tactic on a conv that is not 1x1/stride 1/unpadded");
    }
    return Workspace(geo_, algo_, impl_, rows_per_chunk_);
  }

  static size_t Workspace(const ConvGeometry& g, ConvAlgo algo, GemmImpl impl, int64_t rows) {
    if (algo == ConvAlgo::kDepthwise) return 0;
    int64_t k = g.cg * g.kh * g.kw;
    if (algo == ConvAlgo::kOneByOne) return SgemmWorkspaceBytes(impl, g.mg, g.oh * g.ow, k);
    int64_t r = rows > 0 ? std::min(rows, g.oh) : g.oh;
    return Align64(static_cast<size_t>(k * r * g.ow) * sizeof(float)) +
           SgemmWorkspaceBytes(impl, g.mg, r * g.ow, k);
  }

  Status Run(const KernelRunArgs& args) override {
    const ConvGeometry& g = geo_;
    const float* x = args.inputs[0].as<const float>();
    const float* w = args.inputs[1].as<const float>();
    const float* bias = args.inputs.size() > 2 ? args.inputs[2].as<const float>() : nullptr;
    const float* z = args.inputs.size() > 3 ? args.inputs[3].as<const float>() : nullptr;
    float* y = args.outputs[0].as<float>();
    int64_t ohw = g.oh * g.ow, ihw = g.ih * g.iw;
    int64_t m = g.mg * g.group, c = g.cg * g.group;
    if (algo_ == ConvAlgo::kDepthwise) {
      int64_t mult = g.mg;  // output channels per input channel
      ThreadPool::Default().ParallelFor(g.n * m, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          int64_t n = p / m, oc = p % m, ic = oc / mult;
          float* yp = y + p * ohw;
          DepthwisePlane(g, x + (n * c + ic) * ihw, w + oc * g.kh * g.kw, bias ? bias[oc] : 0.f,
                         yp);
          if (z || spec_.act.kind != FusedActivation::kNone) {
            ApplyEpilogue(yp, 1, ohw, ohw, nullptr, nullptr, z ? z + p * ohw : nullptr, spec_.act);
          }
        }
      });
      return OkStatus();
    }
    int64_t k = g.cg * g.kh * g.kw;
    int64_t rows = rows_per_chunk_ > 0 ? std::min(rows_per_chunk_, g.oh) : g.oh;
    auto* col = static_cast<float*>(args.workspace);
    void* gemm_ws = static_cast<std::byte*>(args.workspace) +
                    (algo_ == ConvAlgo::kOneByOne
                         ? 0
                         : Align64(static_cast<size_t>(k * rows * g.ow) * sizeof(float)));
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t grp = 0; grp < g.group; ++grp) {
        const float* xg = x + (n * c + grp * g.cg) * ihw;
        const float* wg = w + grp * g.mg * k;
        float* yg = y + (n * m + grp * g.mg) * ohw;
        const float* zg = z ? z + (n * m + grp * g.mg) * ohw : nullptr;
        const float* bg = bias ? bias + grp * g.mg : nullptr;
        if (algo_ == ConvAlgo::kOneByOne) {
          Sgemm(impl_, false, false, g.mg, ohw, k, 1.f, wg, k, xg, ihw, 0.f, yg, ohw, gemm_ws);
          Epilogue(yg, zg, bg, 0, ohw, ohw);
          continue;
        }
        for (int64_t oh0 = 0; oh0 < g.oh; oh0 += rows) {
          int64_t oh1 = std::min(g.oh, oh0 + rows);
          int64_t cols = (oh1 - oh0) * g.ow;
          Im2Col(g, xg, oh0, oh1, col);
          Sgemm(impl_, false, false, g.mg, cols, k, 1.f, wg, k, col, cols, 0.f, yg + oh0 * g.ow,
                ohw, gemm_ws);
          Epilogue(yg, zg, bg, oh0 * g.ow, cols, ohw);
        }
      }
    }
    return OkStatus();
  }

 private:
  // Bias, residual and activation on columns [col0, col0 + cols) of an Mg x ld block.
  void Epilogue(float* yg, const float* zg, const float* bg, int64_t col0, int64_t cols,
                int64_t ld) const {
    if (!zg && !bg && spec_.act.kind == FusedActivation::kNone) return;
    ThreadPool::Default().ParallelFor(geo_.mg, [&](int64_t r0, int64_t r1) {
      ApplyEpilogue(yg + r0 * ld + col0, r1 - r0, cols, ld, bg ? bg + r0 : nullptr, nullptr,
                    zg ? zg + r0 * ld + col0 : nullptr, spec_.act);
    });
  }

  ConvSpec spec_;
  ConvAlgo algo_;
  GemmImpl impl_;
  int64_t rows_per_chunk_;
  ConvGeometry geo_;
};

// Conv and FusedConv share the provider; FusedConv adds the residual input and activation.
class ConvProviderBase : public CpuFloatProvider {
 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    auto spec = ReadConvSpec(request);
    if (!spec.ok()) return {};
    auto g = MaxConvGeometry(*spec, request);
    if (!g.ok()) return {};
    std::vector<TacticConfig> out;
    auto add = [&](std::string name, ConvAlgo algo, GemmImpl impl, int64_t rows) {
      size_t ws = ConvKernel::Workspace(*g, algo, impl, rows);
      out.push_back(
          {std::move(name), {static_cast<int64_t>(algo), static_cast<int64_t>(impl), rows}, ws});
    };
    bool depthwise = g->cg == 1 && g->group > 1;
    bool one_by_one = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
                      g->pw == 0 && g->pad_h_end == 0 && g->pad_w_end == 0;
    // Heuristic order (best guess first): oneDNN was the fastest on every ResNet-50 shape on a
    // 16-core AVX-512 machine (bench/cpu); then the direct/1x1 special cases, then im2col.
    if (request.inputs[1].constant) {
      if (auto onednn = OneDnnConvTactic(*spec, *g)) out.push_back(*onednn);
    }
    if (depthwise) {
      add(fmt::format("f32-conv-cpu-direct-dw{}x{}", g->kh, g->kw), ConvAlgo::kDepthwise,
          GemmImpl::kOpenBlas, 0);
    }
    if (one_by_one) {
      add("f32-conv-cpu-1x1-gemm", ConvAlgo::kOneByOne, GemmImpl::kOpenBlas, 0);
    }
    add("f32-conv-cpu-im2col-openblas", ConvAlgo::kIm2col, GemmImpl::kOpenBlas, 0);
    // Chunked: about 1 MiB of im2col rows (L2-sized), the low-workspace choice, but at least
    // 256 GEMM columns so the sgemm stays efficient.
    int64_t k = g->cg * g->kh * g->kw;
    int64_t rows = std::max((int64_t{1} << 18) / std::max<int64_t>(1, k * g->ow),
                            (255 + g->ow) / std::max<int64_t>(1, g->ow));
    if (rows < g->oh) {
      add(fmt::format("f32-conv-cpu-im2col-openblas-rows{}", rows), ConvAlgo::kIm2col,
          GemmImpl::kOpenBlas, rows);
    }
    add("f32-conv-cpu-im2col-blocked-8x8", ConvAlgo::kIm2col, GemmImpl::kBlocked8x8, 0);
    return out;
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(ConvSpec spec, ReadConvSpec(request));
    if (tactic.params.size() != 3 || tactic.params[0] < 0 || tactic.params[0] > 3 ||
        tactic.params[1] < 0 || tactic.params[1] > 1 || tactic.params[2] < 0) {
      return MakeError(ErrorCode::kInvalidArgument, "{}: tactic '{}' has invalid params", id(),
                       tactic.name);
    }
    auto algo = static_cast<ConvAlgo>(tactic.params[0]);
    if (algo == ConvAlgo::kOneDnn) return CreateOneDnnConv(request, spec);
    return std::unique_ptr<Kernel>(std::make_unique<ConvKernel>(
        std::move(spec), algo, static_cast<GemmImpl>(tactic.params[1]), tactic.params[2]));
  }
};

class ConvProvider final : public ConvProviderBase {
 public:
  std::string_view id() const override { return "cpu.conv"; }
  std::string_view op_type() const override { return "Conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(ConvProvider);

class FusedConvProvider final : public ConvProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_conv"; }
  std::string_view op_type() const override { return "FusedConv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(FusedConvProvider);

}  // namespace
}  // namespace kiln::cpu
