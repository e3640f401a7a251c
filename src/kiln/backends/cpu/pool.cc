// MaxPool, AveragePool, LpPool, GlobalAveragePool and GlobalMaxPool on the CPU (1-D, 2-D and 3-D
// windows; global pools any rank): direct loops, parallel over the N*C planes.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// Per spatial axis (depth, height, width; a 1-D or 2-D window leaves the outer ones at size 1).
struct PoolGeometry {
  int64_t planes = 0, id = 1, ih = 1, iw = 1, od = 1, oh = 1, ow = 1;
  int64_t kd = 1, kh = 1, kw = 1, sd = 1, sh = 1, sw = 1, dd = 1, dh = 1, dw = 1;
  int64_t pd = 0, ph = 0, pw = 0, ped = 0, peh = 0, pew = 0;
};

enum class PoolMode { kMax, kAverage, kLp };

class PoolKernel final : public Kernel {
 public:
  // `p`: LpPool's norm order (kLp only).
  PoolKernel(nn::WindowAttrs attrs, PoolMode mode, bool count_include_pad, int64_t p = 2)
      : attrs_(std::move(attrs)), mode_(mode), count_include_pad_(count_include_pad), p_(p) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const auto& x = inputs[0].dims;
    const auto& y = outputs[0].dims;
    size_t r = attrs_.kernel.size();
    if (x.size() != r + 2 || y.size() != r + 2 || r < 1 || r > 3) {
      return MakeError(ErrorCode::kShapeMismatch, "pool operand ranks do not match the kernel");
    }
    PoolGeometry& g = g_;
    g.planes = x[0] * x[1];
    auto axis = [&](size_t i, int64_t& in, int64_t& out, int64_t& k, int64_t& s, int64_t& d,
                    int64_t& pb, int64_t& pe) -> Status {
      in = x[i + 2];
      out = nn::WindowOutDim<int64_t>(in, attrs_, i);
      if (out != y[i + 2]) {
        return MakeError(ErrorCode::kShapeMismatch, "pool output dim {} is {}; expected {}", i,
                         y[i + 2], out);
      }
      k = attrs_.kernel[i];
      s = attrs_.strides[i];
      d = attrs_.dilations[i];
      pb = nn::WindowPadBegin(in, out, attrs_, i);
      // End padding as the attributes give it (SAME: the rest of the total padding).
      pe = attrs_.auto_pad == nn::AutoPad::kNotSet
               ? attrs_.pads[i + r]
               : std::max<int64_t>(0, (out - 1) * s + d * (k - 1) + 1 - in - pb);
      if (attrs_.auto_pad == nn::AutoPad::kValid) pe = 0;
      return OkStatus();
    };
    if (r == 3) KILN_RETURN_IF_ERROR(axis(0, g.id, g.od, g.kd, g.sd, g.dd, g.pd, g.ped));
    if (r >= 2) KILN_RETURN_IF_ERROR(axis(r - 2, g.ih, g.oh, g.kh, g.sh, g.dh, g.ph, g.peh));
    KILN_RETURN_IF_ERROR(axis(r - 1, g.iw, g.ow, g.kw, g.sw, g.dw, g.pw, g.pew));
    return size_t{0};
  }

  Status Run(const KernelRunArgs& args) override {
    const float* x = args.inputs[0].as<const float>();
    float* y = args.outputs[0].as<float>();
    const PoolGeometry& g = g_;
    ThreadPool::Default().ParallelFor(g.planes, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        Plane(x + p * g.id * g.ih * g.iw, y + p * g.od * g.oh * g.ow);
      }
    });
    return OkStatus();
  }

 private:
  void Plane(const float* x, float* y) const {
    const PoolGeometry& g = g_;
    for (int64_t od = 0; od < g.od; ++od) {
      const int64_t d0 = od * g.sd - g.pd;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        const int64_t h0 = oh * g.sh - g.ph;
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const int64_t w0 = ow * g.sw - g.pw;
          float best = -std::numeric_limits<float>::infinity();
          float sum = 0.f;
          int64_t count = 0, padded_count = 0;
          for (int64_t kz = 0; kz < g.kd; ++kz) {
            const int64_t id = d0 + kz * g.dd;
            const bool d_in = id >= 0 && id < g.id;
            const bool d_padded = id >= -g.pd && id < g.id + g.ped;
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              const int64_t ih = h0 + ky * g.dh;
              const bool h_in = d_in && ih >= 0 && ih < g.ih;
              const bool h_padded = d_padded && ih >= -g.ph && ih < g.ih + g.peh;
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t iw = w0 + kx * g.dw;
                if (h_padded && iw >= -g.pw && iw < g.iw + g.pew) ++padded_count;
                if (!h_in || iw < 0 || iw >= g.iw) continue;
                const float v = x[(id * g.ih + ih) * g.iw + iw];
                best = std::max(best, v);
                sum += mode_ == PoolMode::kLp
                           ? (p_ == 2 ? v * v : std::pow(std::fabs(v), static_cast<float>(p_)))
                           : v;
                ++count;
              }
            }
          }
          float* out = y + (od * g.oh + oh) * g.ow + ow;
          if (mode_ == PoolMode::kMax) {
            *out = best;
          } else if (mode_ == PoolMode::kLp) {
            // Padding contributes zeros to the p-norm.
            *out = p_ == 2 ? std::sqrt(sum) : std::pow(sum, 1.f / static_cast<float>(p_));
          } else {
            // count_include_pad counts window positions inside the padded input (not those past
            // it in ceil mode), as the ONNX reference does.
            const int64_t div = count_include_pad_ ? padded_count : count;
            *out = div > 0 ? sum / static_cast<float>(div) : 0.f;
          }
        }
      }
    }
  }

  nn::WindowAttrs attrs_;
  PoolMode mode_;
  bool count_include_pad_;
  int64_t p_;
  PoolGeometry g_;
};

template <PoolMode kMode>
class PoolProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override {
    return kMode == PoolMode::kMax ? "cpu.maxpool"
                                   : (kMode == PoolMode::kLp ? "cpu.lppool" : "cpu.averagepool");
  }
  std::string_view op_type() const override {
    return kMode == PoolMode::kMax ? "MaxPool"
                                   : (kMode == PoolMode::kLp ? "LpPool" : "AveragePool");
  }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    size_t rank = request.inputs[0].shape.size();
    if (rank < 3 || rank > 5 || request.outputs.size() != 1) return {};
    return {{kMode == PoolMode::kMax  ? "f32-maxpool-cpu-direct"
             : kMode == PoolMode::kLp ? "f32-lppool-cpu-direct"
                                      : "f32-averagepool-cpu-direct",
             {},
             0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig&) const override {
    size_t rank = request.inputs[0].shape.size();
    if (request.outputs.size() != 1) {
      return MakeError(ErrorCode::kUnimplemented,
                       "node '{}': MaxPool's Indices output is not supported",
                       request.node->name());
    }
    auto attrs = nn::ReadWindowAttrs(request.node->attrs(), rank - 2, {});
    if (!attrs.ok()) {
      return MakeError(attrs.status().code(), "node '{}': {}", request.node->name(),
                       attrs.status().message());
    }
    return std::unique_ptr<Kernel>(std::make_unique<PoolKernel>(
        std::move(*attrs), kMode, attrs::AveragePool::count_include_pad(*request.node) != 0,
        attrs::LpPool::p(*request.node)));
  }
};
using MaxPoolProvider = PoolProvider<PoolMode::kMax>;
using AveragePoolProvider = PoolProvider<PoolMode::kAverage>;
using LpPoolProvider = PoolProvider<PoolMode::kLp>;
KILN_REGISTER_KERNEL_PROVIDER(MaxPoolProvider);
KILN_REGISTER_KERNEL_PROVIDER(AveragePoolProvider);
KILN_REGISTER_KERNEL_PROVIDER(LpPoolProvider);

// Global pools: one value per plane, any spatial rank.
template <bool kMax>
class GlobalPoolProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override {
    return kMax ? "cpu.globalmaxpool" : "cpu.globalaveragepool";
  }
  std::string_view op_type() const override { return kMax ? "GlobalMaxPool" : "GlobalAveragePool"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest&) const override {
    return {{kMax ? "f32-globalmaxpool-cpu" : "f32-globalaveragepool-cpu", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest&,
                                              const TacticConfig&) const override {
    return std::unique_ptr<Kernel>(std::make_unique<FnKernel>([](const KernelRunArgs& a) {
      const auto& dims = a.inputs[0].dims;
      int64_t planes = dims[0] * dims[1];
      int64_t size = planes == 0 ? 0 : a.inputs[0].num_elements() / planes;
      const float* x = a.inputs[0].as<const float>();
      float* y = a.outputs[0].as<float>();
      ThreadPool::Default().ParallelFor(planes, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const float* src = x + p * size;
          if (kMax) {
            float best = -std::numeric_limits<float>::infinity();
            for (int64_t i = 0; i < size; ++i) best = std::max(best, src[i]);
            y[p] = best;
          } else {
            double sum = 0;
            for (int64_t i = 0; i < size; ++i) sum += src[i];
            y[p] = static_cast<float>(sum / static_cast<double>(size));
          }
        }
      });
      return OkStatus();
    }));
  }
};
using GlobalMaxPoolProvider = GlobalPoolProvider<true>;
using GlobalAveragePoolProvider = GlobalPoolProvider<false>;
KILN_REGISTER_KERNEL_PROVIDER(GlobalMaxPoolProvider);
KILN_REGISTER_KERNEL_PROVIDER(GlobalAveragePoolProvider);

}  // namespace
}  // namespace kiln::cpu
