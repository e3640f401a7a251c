// Reductions (ReduceSum/Mean/Max/Min/Prod/L2/SumSquare/LogSumExp), ArgMax/ArgMin, CumSum and
// TopK on the CPU. The input is viewed as [outer, n, inner] when the reduced axes are adjacent
// (the usual case); other axis sets are first transposed (into the workspace) so the reduced
// axes come last.
// Accumulation is in double (CumSum/CumProd: in the element type); floats store FP32 (f16/bf16
// through the wrapper).
#include <cmath>
#include <numeric>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

struct Reducer {
  double init;
  double (*pre)(double);  // applied to each element
  double (*combine)(double, double);
  double (*post)(double acc, int64_t n);
};

double Id(double x) { return x; }
double Sq(double x) { return x * x; }
double Plus(double a, double b) { return a + b; }
double Keep(double a, int64_t) { return a; }

#define KILN_CPU_REDUCE_OPS(X)                                                                     \
  X(ReduceSum, 0.0, Id, Plus, Keep)                                                                \
  X(ReduceMean, 0.0, Id, Plus, [](double a, int64_t n) { return n ? a / n : NAN; })                \
  X(                                                                                               \
      ReduceMax, -INFINITY, Id, [](double a, double b) { return (a > b || a != a) ? a : b; },      \
      Keep)                                                                                        \
  X(                                                                                               \
      ReduceMin, INFINITY, Id, [](double a, double b) { return (a < b || a != a) ? a : b; }, Keep) \
  X(                                                                                               \
      ReduceProd, 1.0, Id, [](double a, double b) { return a * b; }, Keep)                         \
  X(ReduceSumSquare, 0.0, Sq, Plus, Keep)                                                          \
  X(                                                                                               \
      ReduceL1, 0.0, [](double x) { return std::fabs(x); }, Plus, Keep)                            \
  X(ReduceL2, 0.0, Sq, Plus, [](double a, int64_t) { return std::sqrt(a); })                       \
  X(ReduceLogSum, 0.0, Id, Plus, [](double a, int64_t) { return std::log(a); })                    \
  X(                                                                                               \
      ReduceLogSumExp, 0.0, [](double x) { return std::exp(x); }, Plus,                            \
      [](double a, int64_t) { return std::log(a); })

// The reduced axes of `x` under a node's axes input and noop flag (empty: none / all).
using AxisFlags = SmallVec<uint8_t, 12>;  // inline: built in Run without allocating

AxisFlags ReducedAxes(const KernelRunArgs& a, bool noop) {
  size_t rank = a.inputs[0].dims.size();
  DimVec axes;
  if (a.inputs.size() > 1 && a.inputs[1].data) axes = ReadInts(a.inputs[1]);
  AxisFlags reduce(rank, axes.empty() && !noop ? 1 : 0);
  for (int64_t ax : axes) reduce[ax < 0 ? ax + static_cast<int64_t>(rank) : ax] = true;
  return reduce;
}

// Reduces x (as T) over `reduce` axes into y. Moves reduced axes last when they are not adjacent.
template <typename T>
void ReduceTyped(const TensorView& x, const TensorView& y, const AxisFlags& reduce,
                 const Reducer& red, void* workspace) {
  size_t rank = x.dims.size();
  const T* src = x.as<const T>();
  DimVec perm;
  for (size_t i = 0; i < rank; ++i) {
    if (!reduce[i]) perm.push_back(static_cast<int64_t>(i));
  }
  for (size_t i = 0; i < rank; ++i) {
    if (reduce[i]) perm.push_back(static_cast<int64_t>(i));
  }
  // Dims of size 1 do not matter; the reduced ones are adjacent when they form one block.
  SmallVec<std::pair<int64_t, bool>, 12> big;
  for (size_t i = 0; i < rank; ++i) {
    if (x.dims[i] != 1) big.push_back({x.dims[i], reduce[i]});
  }
  int64_t first = -1, last = -1;
  bool adjacent = true;
  for (int64_t k = 0; k < static_cast<int64_t>(big.size()); ++k) {
    if (!big[k].second) continue;
    if (first >= 0 && last + 1 != k) adjacent = false;
    if (first < 0) first = k;
    last = k;
  }
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t k = 0; k < static_cast<int64_t>(big.size()); ++k) {
    if (first < 0 || k < first) {
      outer *= big[k].first;
    } else if (k <= last) {
      n *= big[k].first;
    } else {
      inner *= big[k].first;
    }
  }
  if (!adjacent) {
    // Transpose so that the reduced axes are innermost: [kept..., reduced...].
    T* moved = static_cast<T*>(workspace);
    TransposeBytes(src, moved, x.dims, perm, sizeof(T));
    src = moved;
    outer = 1;
    n = 1;
    inner = 1;
    for (size_t i = 0; i < rank; ++i) (reduce[i] ? n : outer) *= x.dims[i];
  }
  T* dst = y.as<T>();
  ParallelRows(outer * inner, n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / inner, i = t % inner;
      const T* p = src + o * n * inner + i;
      double acc = red.init;
      for (int64_t j = 0; j < n; ++j)
        acc = red.combine(acc, red.pre(static_cast<double>(p[j * inner])));
      dst[t] = static_cast<T>(red.post(acc, n));
    }
  });
}

// f32 (f16/bf16 through the wrapper), f64 and every integer type.
bool ReduceTypes(const KernelRequest& r) {
  DataType t = InType(r, 0);
  return t == DataType::kFloat32 || t == DataType::kFloat64 || IsInteger(t);
}

// [outer, n, inner] around one axis.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
  AxisView(std::span<const int64_t> dims, int64_t axis) {
    for (int64_t i = 0; i < static_cast<int64_t>(dims.size()); ++i) {
      (i < axis ? outer : (i == axis ? n : inner)) *= dims[i];
    }
  }
};

int64_t NormAxis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

template <typename T>
void ArgReduce(const KernelRunArgs& a, int64_t axis, bool is_max, bool last) {
  const TensorView& x = a.inputs[0];
  AxisView v(x.dims, NormAxis(axis, x.dims.size()));
  const T* src = x.as<const T>();
  int64_t* dst = a.outputs[0].as<int64_t>();
  ParallelRows(v.outer * v.inner, v.n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const T* p = src + (t / v.inner) * v.n * v.inner + t % v.inner;
      int64_t best = 0;
      for (int64_t j = 1; j < v.n; ++j) {
        T c = p[j * v.inner], bv = p[best * v.inner];
        bool better = is_max ? (last ? c >= bv : c > bv) : (last ? c <= bv : c < bv);
        if (better) best = j;
      }
      dst[t] = best;
    }
  });
}

// CumSum (kProd false) and CumProd along the axis input.
template <typename T, bool kProd = false>
void CumSum(const KernelRunArgs& a, bool exclusive, bool reverse) {
  const TensorView& x = a.inputs[0];
  int64_t axis = ReadInts(a.inputs[1])[0];
  AxisView v(x.dims, NormAxis(axis, x.dims.size()));
  const T* src = x.as<const T>();
  T* dst = a.outputs[0].as<T>();
  ParallelRows(v.outer * v.inner, v.n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t base = (t / v.inner) * v.n * v.inner + t % v.inner;
      T acc = kProd ? T(1) : T(0);
      for (int64_t s = 0; s < v.n; ++s) {
        int64_t j = reverse ? v.n - 1 - s : s;
        int64_t k = base + j * v.inner;
        if (exclusive) dst[k] = acc;
        acc = kProd ? static_cast<T>(acc * src[k]) : static_cast<T>(acc + src[k]);
        if (!exclusive) dst[k] = acc;
      }
    }
  });
}

template <typename T>
void TopK(const KernelRunArgs& a, int64_t axis_attr, bool largest, bool sorted) {
  const TensorView& x = a.inputs[0];
  int64_t axis = NormAxis(axis_attr, x.dims.size());
  AxisView v(x.dims, axis);
  int64_t k = a.outputs[0].dims[axis];
  const T* src = x.as<const T>();
  T* vals = a.outputs[0].as<T>();
  int64_t* idx = a.outputs[1].as<int64_t>();
  // One index buffer of n per part, in the workspace (TopKWorkspace): Run does not allocate.
  int64_t rows = v.outer * v.inner;
  int64_t parts = std::min<int64_t>(ThreadPool::Default().size(), rows);
  ThreadPool::Default().ParallelFor(parts, [&](int64_t p0, int64_t p1) {
    for (int64_t part = p0; part < p1; ++part) {
      std::span<int64_t> order(static_cast<int64_t*>(a.workspace) + part * v.n,
                               static_cast<size_t>(v.n));
      for (int64_t t = part * rows / parts; t < (part + 1) * rows / parts; ++t) {
        int64_t o = t / v.inner, i = t % v.inner;
        const T* p = src + o * v.n * v.inner + i;
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first (ONNX).
        auto cmp = [&](int64_t l, int64_t r) {
          T lv = p[l * v.inner], rv = p[r * v.inner];
          if (lv == rv) return l < r;
          return largest ? lv > rv : lv < rv;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), cmp);
        if (!sorted) std::sort(order.begin(), order.begin() + k);
        for (int64_t j = 0; j < k; ++j) {
          int64_t out = (o * k + j) * v.inner + i;
          vals[out] = p[order[j] * v.inner];
          idx[out] = order[j];
        }
      }
    }
  });
}

// Hardmax: 1 at the first maximum along the axis, 0 elsewhere.
template <typename T>
void Hardmax(const KernelRunArgs& a, int64_t axis) {
  const TensorView& x = a.inputs[0];
  AxisView v(x.dims, NormAxis(axis, x.dims.size()));
  const T* src = x.as<const T>();
  T* dst = a.outputs[0].as<T>();
  ParallelRows(v.outer * v.inner, v.n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t off = (t / v.inner) * v.n * v.inner + t % v.inner;
      int64_t best = 0;
      for (int64_t j = 1; j < v.n; ++j) {
        if (src[off + j * v.inner] > src[off + best * v.inner]) best = j;
      }
      for (int64_t j = 0; j < v.n; ++j) dst[off + j * v.inner] = j == best ? T(1) : T(0);
    }
  });
}

// LpNormalization: x / ||x||_p along the axis (p 1 or 2); a zero vector stays zero (as ONNX's
// reference for opset 22, and ONNX Runtime).
template <typename T>
void LpNormalize(const KernelRunArgs& a, int64_t axis, int64_t p) {
  const TensorView& x = a.inputs[0];
  AxisView v(x.dims, NormAxis(axis, x.dims.size()));
  const T* src = x.as<const T>();
  T* dst = a.outputs[0].as<T>();
  ParallelRows(v.outer * v.inner, v.n, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t off = (t / v.inner) * v.n * v.inner + t % v.inner;
      double norm = 0;
      for (int64_t j = 0; j < v.n; ++j) {
        const double xj = static_cast<double>(src[off + j * v.inner]);
        norm += p == 1 ? std::fabs(xj) : xj * xj;
      }
      if (p == 2) norm = std::sqrt(norm);
      const double scale = norm == 0 ? 0.0 : 1.0 / norm;
      for (int64_t j = 0; j < v.n; ++j) {
        dst[off + j * v.inner] =
            static_cast<T>(static_cast<double>(src[off + j * v.inner]) * scale);
      }
    }
  });
}

size_t TopKWorkspace(std::span<const TensorView> in, int64_t axis_attr) {
  int64_t n = in[0].dims.empty() ? 1 : in[0].dims[NormAxis(axis_attr, in[0].dims.size())];
  return static_cast<size_t>(ThreadPool::Default().size() * n) * sizeof(int64_t);
}

// DispatchNumeric with bool read as its byte (the reductions compare and count bytes).
template <typename F>
Status ForReduceType(DataType t, F&& f) {
  return DispatchNumeric(t, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      return f(std::type_identity<uint8_t>{});
    } else {
      return f(tag);
    }
  });
}

// TopK reads K from its input when it runs: a constant or shape input gives the dims inference
// made; a K computed at run time is a data-dependent dim (docs/architecture.md), so the kernel
// writes [.., K, ..] densely and reports those dims (Kernel::RunOutputDims).
class TopKKernel final : public Kernel {
 public:
  TopKKernel(DataType t, int64_t axis, bool largest, bool sorted)
      : t_(t), axis_(axis), largest_(largest), sorted_(sorted) {
    dims_.reserve(8);
  }
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    return TopKWorkspace(in, axis_);
  }
  Status Run(const KernelRunArgs& a) override {
    const TensorView& x = a.inputs[0];
    if (x.dims.empty()) {
      return MakeError(ErrorCode::kShapeMismatch, "TopK of a scalar: the input needs an axis");
    }
    const size_t axis = static_cast<size_t>(NormAxis(axis_, x.dims.size()));
    const int64_t k = ReadInt(a.inputs[1], 0);
    if (k < 0 || k > x.dims[axis]) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "TopK: K is {} but axis {} has {} elements; K must be within [0, {}]", k,
                       axis, x.dims[axis], x.dims[axis]);
    }
    dims_.assign(x.dims.begin(), x.dims.end());
    dims_[axis] = k;
    for (size_t i = 0; i < 2; ++i) {
      outs_[i] = a.outputs[i];
      outs_[i].dims = dims_;
    }
    KernelRunArgs b = a;
    b.outputs = std::span<const TensorView>(outs_, 2);
    return ForReduceType(t_, [&](auto tag) -> Status {
      TopK<typename decltype(tag)::type>(b, axis_, largest_, sorted_);
      return OkStatus();
    });
  }
  const std::vector<int64_t>* RunOutputDims(size_t i) const override {
    return i < 2 ? &dims_ : nullptr;
  }

 private:
  DataType t_;
  int64_t axis_;
  bool largest_, sorted_;
  std::vector<int64_t> dims_;
  TensorView outs_[2];
};

void RegisterReduce(const char* op, Reducer red, bool float_only) {
  RegisterOpKernel({
      .op_type = op,
      .accepts =
          [float_only, name = std::string(op)](const KernelRequest& r) {
            // Max/Min are defined on bools (opset 20).
            if (InType(r, 0) == DataType::kBool) return name == "ReduceMax" || name == "ReduceMin";
            DataType t = InType(r, 0);
            return float_only ? (t == DataType::kFloat32 || t == DataType::kFloat64)
                              : ReduceTypes(r);
          },
      .create = [red](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        bool noop = attrs::ReduceSum::noop_with_empty_axes(*r.node) != 0;
        DataType t = InType(r, 0);
        // Reduced axes that are not adjacent are first moved last, in the workspace: asked for
        // unless at most one axis is reduced.
        const OperandDesc* axes = r.inputs.size() > 1 ? &r.inputs[1] : nullptr;
        bool one_axis = axes && axes->dtype != DataType::kUndefined && axes->shape.size() == 1 &&
                        axes->shape[0].is_static() && axes->shape[0].value() <= 1;
        auto prepare = [one_axis](std::span<const TensorView> in,
                                  std::span<const TensorView>) -> StatusOr<size_t> {
          return one_axis ? size_t{0} : in[0].size_bytes();
        };
        auto run = [=](const KernelRunArgs& a) {
          AxisFlags reduce = ReducedAxes(a, noop);
          return ForReduceType(t, [&](auto tag) -> Status {
            ReduceTyped<typename decltype(tag)::type>(a.inputs[0], a.outputs[0], reduce, red,
                                                      a.workspace);
            return OkStatus();
          });
        };
        return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(run, prepare));
      },
  });
}

const bool kRegistered = [] {
#define KILN_REGISTER_REDUCE(Name, init, pre, combine, post)         \
  RegisterReduce(#Name, Reducer{init, pre, combine, post},           \
                 std::string_view(#Name) == "ReduceL2" ||            \
                     std::string_view(#Name) == "ReduceLogSumExp" || \
                     std::string_view(#Name) == "ReduceLogSum");
  KILN_CPU_REDUCE_OPS(KILN_REGISTER_REDUCE)
#undef KILN_REGISTER_REDUCE

  for (bool is_max : {true, false}) {
    RegisterOpKernel({
        .op_type = is_max ? "ArgMax" : "ArgMin",
        .accepts = ReduceTypes,
        .create =
            [is_max](const KernelRequest& r) {
              int64_t axis = attrs::ArgMax::axis(*r.node);  // ArgMin declares the same defaults
              bool last = attrs::ArgMax::select_last_index(*r.node) != 0;
              DataType t = InType(r, 0);
              return KernelOr([=](const KernelRunArgs& a) {
                return ForReduceType(t, [&](auto tag) -> Status {
                  ArgReduce<typename decltype(tag)::type>(a, axis, is_max, last);
                  return OkStatus();
                });
              });
            },
    });
  }
  const auto float_types = [](const KernelRequest& r) {
    return InType(r, 0) == DataType::kFloat32 || InType(r, 0) == DataType::kFloat64;
  };
  RegisterOpKernel({
      .op_type = "Hardmax",
      .accepts = float_types,
      .create =
          [](const KernelRequest& r) {
            int64_t axis = attrs::Hardmax::axis(*r.node);
            DataType t = InType(r, 0);
            return KernelOr([=](const KernelRunArgs& a) {
              return ForReduceType(t, [&](auto tag) -> Status {
                Hardmax<typename decltype(tag)::type>(a, axis);
                return OkStatus();
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "LpNormalization",
      .accepts = float_types,
      .create =
          [](const KernelRequest& r) {
            int64_t axis = attrs::LpNormalization::axis(*r.node);
            int64_t p = attrs::LpNormalization::p(*r.node);
            DataType t = InType(r, 0);
            return KernelOr([=](const KernelRunArgs& a) {
              return ForReduceType(t, [&](auto tag) -> Status {
                LpNormalize<typename decltype(tag)::type>(a, axis, p);
                return OkStatus();
              });
            });
          },
  });
  for (bool prod : {false, true}) {
    RegisterOpKernel({
        .op_type = prod ? "CumProd" : "CumSum",
        .accepts = ReduceTypes,
        .create =
            [prod](const KernelRequest& r) {
              // CumProd declares the same attributes and defaults.
              bool exclusive = attrs::CumSum::exclusive(*r.node) != 0;
              bool reverse = attrs::CumSum::reverse(*r.node) != 0;
              DataType t = InType(r, 0);
              return KernelOr([=](const KernelRunArgs& a) {
                return ForReduceType(t, [&](auto tag) -> Status {
                  using T = typename decltype(tag)::type;
                  if (prod) {
                    CumSum<T, true>(a, exclusive, reverse);
                  } else {
                    CumSum<T>(a, exclusive, reverse);
                  }
                  return OkStatus();
                });
              });
            },
    });
  }
  RegisterOpKernel({
      .op_type = "TopK",
      .accepts =
          [](const KernelRequest& r) {
            // A run-time K (a data-dependent dim) is reported by TopKKernel itself: the f16/bf16
            // wrapper would convert the outputs at their bound dims, so those types are refused.
            const Value* y = r.node->output(0);
            const bool run_time_k =
                y && std::any_of(y->shape().begin(), y->shape().end(), [](const Dim& d) {
                  auto s = d.Symbols();
                  return s.size() == 1 && IsDataDependentSymbol(s[0]);
                });
            const bool half =
                y && (y->dtype() == DataType::kFloat16 || y->dtype() == DataType::kBFloat16);
            return ReduceTypes(r) && !(run_time_k && half);
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::make_unique<TopKKernel>(InType(r, 0), attrs::TopK::axis(*r.node),
                                            attrs::TopK::largest(*r.node) != 0,
                                            attrs::TopK::sorted(*r.node) != 0);
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
