// InstanceNormalization, LRN and MeanVarianceNormalization on the CPU (f32 and f64; f16/bf16
// through the wrapper), statistics in double. Reference loops: these ops are rare in inference
// graphs (normalization layers of deployed models are LayerNormalization or folded BatchNorm).
#include <algorithm>
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

bool FloatTypes(const KernelRequest& r) {
  return InType(r, 0) == DataType::kFloat32 || InType(r, 0) == DataType::kFloat64;
}

template <typename F>
Status ForFloat(DataType t, F&& f) {
  if (t == DataType::kFloat64) return f(std::type_identity<double>{});
  return f(std::type_identity<float>{});
}

// y = scale[c] * (x - mean) / sqrt(var + epsilon) + B[c], statistics per (n, c) over the rest.
template <typename T>
void InstanceNorm(const KernelRunArgs& a, double epsilon) {
  const TensorView& x = a.inputs[0];
  const int64_t n = x.dims[0], c = x.dims[1], inner = x.num_elements() / (n * c);
  const T* src = x.as<const T>();
  const T* scale = a.inputs[1].as<const T>();
  const T* bias = a.inputs[2].as<const T>();
  T* dst = a.outputs[0].as<T>();
  ParallelRows(n * c, inner * 3, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const T* p = src + t * inner;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < inner; ++i) mean += static_cast<double>(p[i]);
      mean /= static_cast<double>(inner);
      for (int64_t i = 0; i < inner; ++i) {
        const double d = static_cast<double>(p[i]) - mean;
        var += d * d;
      }
      var /= static_cast<double>(inner);
      const double k = static_cast<double>(scale[t % c]) / std::sqrt(var + epsilon);
      const double off = static_cast<double>(bias[t % c]);
      for (int64_t i = 0; i < inner; ++i) {
        dst[t * inner + i] = static_cast<T>((static_cast<double>(p[i]) - mean) * k + off);
      }
    }
  });
}

// y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta; the window of channel
// c is [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)].
template <typename T>
void Lrn(const KernelRunArgs& a, double alpha, double beta, double bias, int64_t size) {
  const TensorView& x = a.inputs[0];
  const int64_t n = x.dims[0], c = x.dims[1], inner = x.num_elements() / (n * c);
  const T* src = x.as<const T>();
  T* dst = a.outputs[0].as<T>();
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  ParallelRows(n * c * inner, size, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t batch = t / (c * inner), ch = (t / inner) % c, i = t % inner;
      double sq = 0;
      for (int64_t k = std::max<int64_t>(0, ch - lo); k <= std::min(c - 1, ch + hi); ++k) {
        const double v = static_cast<double>(src[(batch * c + k) * inner + i]);
        sq += v * v;
      }
      dst[t] = static_cast<T>(static_cast<double>(src[t]) /
                              std::pow(bias + alpha / static_cast<double>(size) * sq, beta));
    }
  });
}

// y = (x - mean) / (sqrt(E[x^2] - mean^2) + 1e-9) over `axes` (ONNX's function body).
// The number of statistics groups (coordinates on the kept axes) of dims under axes.
int64_t MvnGroups(std::span<const int64_t> dims, const std::vector<int64_t>& axes) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  int64_t groups = 1;
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = false;
    for (int64_t ax : axes) reduced |= (ax < 0 ? ax + rank : ax) == d;
    if (!reduced) groups *= dims[d];
  }
  return groups;
}

// Sums go to the workspace (two doubles per group, MvnGroups).
template <typename T>
void MeanVarianceNorm(const KernelRunArgs& a, const std::vector<int64_t>& axes) {
  const TensorView& x = a.inputs[0];
  const size_t rank = x.dims.size();
  SmallVec<uint8_t, 12> reduced(rank, 0);
  for (int64_t ax : axes) reduced[ax < 0 ? ax + static_cast<int64_t>(rank) : ax] = 1;
  // Group index of element i: its coordinates on the kept axes.
  SmallVec<int64_t, 12> strides(rank, 1);
  for (size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * x.dims[d];
  const int64_t groups = MvnGroups(x.dims, axes);
  auto group_of = [&](int64_t i) {
    int64_t g = 0;
    for (size_t d = 0; d < rank; ++d) {
      if (!reduced[d]) g = g * x.dims[d] + (i / strides[d]) % x.dims[d];
    }
    return g;
  };
  const T* src = x.as<const T>();
  T* dst = a.outputs[0].as<T>();
  const int64_t n = x.num_elements();
  double* sum = static_cast<double*>(a.workspace);
  double* sq = sum + groups;
  std::fill(sum, sum + 2 * groups, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(src[i]);
    sum[group_of(i)] += v;
    sq[group_of(i)] += v * v;
  }
  const double count = static_cast<double>(groups ? n / groups : 1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = group_of(i);
    const double mean = sum[g] / count;
    const double var = std::max(0.0, sq[g] / count - mean * mean);
    dst[i] = static_cast<T>((static_cast<double>(src[i]) - mean) / (std::sqrt(var) + 1e-9));
  }
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "InstanceNormalization",
      .accepts = FloatTypes,
      .create =
          [](const KernelRequest& r) {
            const double eps = attrs::InstanceNormalization::epsilon(*r.node);
            return KernelOr([eps, t = InType(r, 0)](const KernelRunArgs& a) {
              return ForFloat(t, [&](auto tag) -> Status {
                InstanceNorm<typename decltype(tag)::type>(a, eps);
                return OkStatus();
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "LRN",
      .accepts = FloatTypes,
      .create =
          [](const KernelRequest& r) {
            const double alpha = attrs::LRN::alpha(*r.node), beta = attrs::LRN::beta(*r.node),
                         bias = attrs::LRN::bias(*r.node);
            const int64_t size = r.node->attrs().GetInt("size", 1);  // required; the rule checks
            return KernelOr([=, t = InType(r, 0)](const KernelRunArgs& a) {
              return ForFloat(t, [&](auto tag) -> Status {
                Lrn<typename decltype(tag)::type>(a, alpha, beta, bias, size);
                return OkStatus();
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "MeanVarianceNormalization",
      .accepts = FloatTypes,
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> axes = attrs::MeanVarianceNormalization::axes(*r.node);
        auto run = [axes, t = InType(r, 0)](const KernelRunArgs& a) {
          return ForFloat(t, [&](auto tag) -> Status {
            MeanVarianceNorm<typename decltype(tag)::type>(a, axes);
            return OkStatus();
          });
        };
        auto prepare = [axes](std::span<const TensorView> in,
                              std::span<const TensorView>) -> StatusOr<size_t> {
          return static_cast<size_t>(2 * MvnGroups(in[0].dims, axes)) * sizeof(double);
        };
        return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(run, prepare));
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
