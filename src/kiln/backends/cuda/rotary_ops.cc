// CUDA provider of RotaryEmbedding (kernel in rotary.cu): Prepare turns cos's and sin's broadcast
// against x into row strides over x's leading dims (merged where they run contiguously, so the
// kernel splits a row index over as few dims as it can). f32, f16 and bf16 storage, FP32 math.
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

// Element strides of `dims` right-aligned against `out` (numpy broadcasting): 0 where the operand
// has size 1 or lacks the dim.
std::vector<int64_t> StridesAgainst(std::span<const int64_t> dims, std::span<const int64_t> out) {
  std::vector<int64_t> s(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < dims.size() && k < out.size(); ++k) {
    size_t di = dims.size() - 1 - k, oi = out.size() - 1 - k;
    s[oi] = dims[di] == 1 ? 0 : stride;
    stride *= dims[di];
  }
  return s;
}

class RotaryKernel final : public Kernel {
 public:
  RotaryKernel(Elem t, bool interleaved, int64_t rot)
      : t_(t), interleaved_(interleaved), rot_(rot) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    if (in[0].dims.empty() || in[0].dims.back() % 2 != 0 || rot_ % 2 != 0 ||
        rot_ > in[0].dims.back()) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "RotaryEmbedding needs X with an even last dim of at least "
                       "rotary_embedding_dim {} (rank {})",
                       rot_, in[0].dims.size());
    }
    // The rotated part of X (partial rotary: its first rot_ elements of each row), which the
    // tables broadcast to; the rest of each row is copied in Run.
    std::vector<int64_t> x(in[0].dims.begin(), in[0].dims.end());
    const int64_t full = x.back();
    if (rot_ > 0) x.back() = rot_;
    for (size_t i = 1; i < 3; ++i) {
      const auto& c = in[i].dims;
      bool fits = c.size() <= x.size();
      for (size_t k = 0; fits && k < c.size(); ++k) {
        int64_t xd = x[x.size() - 1 - k], cd = c[c.size() - 1 - k];
        fits = cd == xd || cd == 1;
      }
      if (!fits) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "RotaryEmbedding: input {} ({} elements) does not broadcast to X", i,
                         in[i].num_elements());
      }
    }
    std::vector<int64_t> cs = StridesAgainst(in[1].dims, x), ss = StridesAgainst(in[2].dims, x);
    RotaryGeometry g;
    g.d = x.back();
    g.ld = full;
    g.rows = full == 0 ? 0 : in[0].num_elements() / full;
    g.cos_step = cs.back();
    g.sin_step = ss.back();
    // Leading dims, outermost first: size-1 dims dropped, a dim merged into the one before it
    // when both operands' strides continue across the boundary (or are both 0).
    std::vector<int64_t> dims, cstr, sstr;
    for (size_t a = 0; a + 1 < x.size(); ++a) {
      if (x[a] == 1) continue;
      if (!dims.empty() && cstr.back() == cs[a] * x[a] && sstr.back() == ss[a] * x[a]) {
        dims.back() *= x[a];
        cstr.back() = cs[a];
        sstr.back() = ss[a];
        continue;
      }
      dims.push_back(x[a]);
      cstr.push_back(cs[a]);
      sstr.push_back(ss[a]);
    }
    if (dims.size() > static_cast<size_t>(kMaxRank)) {
      return MakeError(ErrorCode::kUnimplemented,
                       "RotaryEmbedding on CUDA: cos and sin broadcast over {} separate leading "
                       "dims; at most {}",
                       dims.size(), kMaxRank);
    }
    g.rank = static_cast<int32_t>(dims.size());
    for (size_t k = 0; k < dims.size(); ++k) {
      g.dims[k] = dims[k];
      g.cos_strides[k] = cstr[k];
      g.sin_strides[k] = sstr[k];
    }
    geometry_ = g;
    elem_bytes_ = static_cast<int64_t>(SizeOf(in[0].dtype));
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    const RotaryGeometry& g = geometry_;
    void* y = a.outputs[0].data;
    const void* x = a.inputs[0].data;
    if (g.ld > g.d && g.rows > 0 && y != x) {
      // Partial rotary: the elements past the rotated ones pass through, one strided copy.
      const size_t pitch = static_cast<size_t>(g.ld * elem_bytes_);
      const size_t skip = static_cast<size_t>(g.d * elem_bytes_);
      KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          static_cast<char*>(y) + skip, pitch, static_cast<const char*>(x) + skip, pitch,
          pitch - skip, static_cast<size_t>(g.rows), cudaMemcpyDeviceToDevice, StreamOf(a)));
    }
    return Launched(
        LaunchRotary(t_, interleaved_, x, a.inputs[1].data, a.inputs[2].data, y, g, StreamOf(a)),
        "RotaryEmbedding kernel");
  }

 private:
  Elem t_;
  bool interleaved_;
  int64_t rot_;  // rotary_embedding_dim: 0 rotates the whole last axis
  int64_t elem_bytes_ = 0;
  RotaryGeometry geometry_;
};

CudaOpDef RotaryDef() {
  return {
      .op_type = "RotaryEmbedding",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return r.inputs.size() == 3 && IsFloatStorage(t) && InType(r, 1) == t &&
                   InType(r, 2) == t && OutType(r, 0) == t;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<RotaryKernel>(
            *ToElem(InType(r, 0)), attrs::RotaryEmbedding::interleaved(*r.node) != 0,
            attrs::RotaryEmbedding::rotary_embedding_dim(*r.node)));
      },
  };
}
KILN_CUDA_OP_PROVIDER(RotaryProvider, RotaryDef());

}  // namespace
}  // namespace kiln::cuda
