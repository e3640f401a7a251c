// Col2Im on the CPU: input [N, C * prod(block), L] summed back into the image
// [N, C, image...] (the inverse of Conv's im2col), with dilations, pads and strides. Each
// (n, c) image is written by one task, so the scatter-add needs no atomics.
#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

struct Col2ImSpec {
  std::vector<int64_t> dilations, pads, strides;  // empty: defaults
};

Status RunCol2Im(const Col2ImSpec& s, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& y = a.outputs[0];
  const DimVec block = ReadInts(a.inputs[2]);
  const size_t r = block.size();
  if (r == 0 || y.dims.size() != r + 2 || r > 8) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "Col2Im of {} spatial axes into an output of rank {}", r, y.dims.size());
  }
  int64_t dil[8], pad[8], str[8], count[8], image[8];
  int64_t per_channel = 1, positions = 1, pixels = 1;
  for (size_t i = 0; i < r; ++i) {
    dil[i] = s.dilations.empty() ? 1 : s.dilations[i];
    str[i] = s.strides.empty() ? 1 : s.strides[i];
    pad[i] = s.pads.empty() ? 0 : s.pads[i];
    const int64_t pad_end = s.pads.empty() ? 0 : s.pads[i + r];
    image[i] = y.dims[2 + i];
    count[i] = (image[i] + pad[i] + pad_end - dil[i] * (block[i] - 1) - 1) / str[i] + 1;
    per_channel *= block[i];
    positions *= count[i];
    pixels *= image[i];
  }
  if (x.dims[2] != positions || x.dims[1] != y.dims[1] * per_channel) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "Col2Im input [{}, {}, {}] does not hold {} blocks of {} per channel",
                     x.dims[0], x.dims[1], x.dims[2], positions, per_channel);
  }
  const float* src = x.as<const float>();
  float* dst = y.as<float>();
  const int64_t planes = y.dims[0] * y.dims[1];
  ParallelRows(planes, per_channel * positions, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* img = dst + p * pixels;
      std::fill(img, img + pixels, 0.f);
      const float* cols = src + p * per_channel * positions;
      for (int64_t b = 0; b < per_channel; ++b) {
        // b's offset within the block, per axis (row-major over block).
        int64_t boff[8];
        for (int64_t i = static_cast<int64_t>(r) - 1, rest = b; i >= 0; --i) {
          boff[i] = rest % block[i];
          rest /= block[i];
        }
        for (int64_t l = 0; l < positions; ++l) {
          int64_t off = 0;
          bool inside = true;
          for (int64_t i = static_cast<int64_t>(r) - 1, rest = l, stride = 1; i >= 0; --i) {
            const int64_t at = rest % count[i] * str[i] - pad[i] + boff[i] * dil[i];
            rest /= count[i];
            inside &= at >= 0 && at < image[i];
            off += at * stride;
            stride *= image[i];
          }
          if (inside) img[off] += cols[b * positions + l];
        }
      }
    }
  });
  return OkStatus();
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Col2Im",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && IsIndexType(InType(r, 2));
          },
      .create =
          [](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            Col2ImSpec spec{attrs::Col2Im::dilations(at), attrs::Col2Im::pads(at),
                            attrs::Col2Im::strides(at)};
            return KernelOr([spec](const KernelRunArgs& a) { return RunCol2Im(spec, a); });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
