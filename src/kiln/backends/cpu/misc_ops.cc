// Assorted ONNX ops on the CPU (ops/misc.cc has their shape rules): Det (LU with partial
// pivoting, in double), GroupNormalization, ReverseSequence and TensorScatter (byte moves, any
// type), AffineGrid, MaxUnpool, DeformConv, RoiAlign, and reference kernels of MatMulInteger and
// ConvInteger (int32 accumulation; the INT8 oneDNN tactics serve the QDQ form of these products
// instead).
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// ---- Det --------------------------------------------------------------------------------------

template <typename T>
void RunDetT(const TensorView& x, const TensorView& y) {
  const int64_t m = x.dims.back();
  const int64_t mats = m == 0 ? NumElements(y.dims) : NumElements(x.dims) / (m * m);
  const T* src = x.as<const T>();
  T* dst = y.as<T>();
  ParallelRows(mats, m * m * m, [&](int64_t b0, int64_t b1) {
    std::vector<double> a(static_cast<size_t>(m * m));
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t i = 0; i < m * m; ++i) a[static_cast<size_t>(i)] = src[b * m * m + i];
      double det = 1;
      for (int64_t c = 0; c < m && det != 0; ++c) {
        int64_t pivot = c;
        for (int64_t r = c + 1; r < m; ++r) {
          if (std::fabs(a[static_cast<size_t>(r * m + c)]) >
              std::fabs(a[static_cast<size_t>(pivot * m + c)])) {
            pivot = r;
          }
        }
        const double p = a[static_cast<size_t>(pivot * m + c)];
        if (p == 0) {
          det = 0;
          break;
        }
        if (pivot != c) {
          for (int64_t k = 0; k < m; ++k) {
            std::swap(a[static_cast<size_t>(c * m + k)], a[static_cast<size_t>(pivot * m + k)]);
          }
          det = -det;
        }
        det *= p;
        for (int64_t r = c + 1; r < m; ++r) {
          const double f = a[static_cast<size_t>(r * m + c)] / p;
          if (f == 0) continue;
          for (int64_t k = c; k < m; ++k) {
            a[static_cast<size_t>(r * m + k)] -= f * a[static_cast<size_t>(c * m + k)];
          }
        }
      }
      dst[b] = static_cast<T>(det);
    }
  });
}

Status RunDet(const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  if (x.dims.size() < 2 || x.dims.back() != x.dims[x.dims.size() - 2]) {
    return MakeError(ErrorCode::kShapeMismatch, "Det of [{}]", fmt::join(x.dims, "x"));
  }
  if (x.dtype == DataType::kFloat64) {
    RunDetT<double>(x, a.outputs[0]);
  } else {
    RunDetT<float>(x, a.outputs[0]);
  }
  return OkStatus();
}

// ---- GroupNormalization ------------------------------------------------------------------------

Status RunGroupNorm(int64_t groups, float epsilon, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const int64_t n = x.dims[0], c = x.dims[1];
  const int64_t spatial = n * c == 0 ? 0 : NumElements(x.dims) / (n * c);
  if (groups < 1 || c % groups != 0) {
    return MakeError(ErrorCode::kShapeMismatch, "{} groups do not divide {} channels", groups, c);
  }
  const int64_t per_group = c / groups;
  const float* src = x.as<const float>();
  const float* scale = a.inputs[1].as<const float>();
  const float* bias = a.inputs[2].as<const float>();
  float* dst = a.outputs[0].as<float>();
  ParallelRows(n * groups, per_group * spatial * 3, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t first = g * per_group * spatial, count = per_group * spatial;
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < count; ++i) sum += src[first + i];
      const double mean = count ? sum / static_cast<double>(count) : 0.0;
      for (int64_t i = 0; i < count; ++i) {
        const double d = src[first + i] - mean;
        sq += d * d;
      }
      const double var = count ? sq / static_cast<double>(count) : 0.0;
      const double inv = 1.0 / std::sqrt(var + static_cast<double>(epsilon));
      for (int64_t k = 0; k < per_group; ++k) {
        const int64_t ch = (g % groups) * per_group + k;
        const double s = scale[ch] * inv, b = bias[ch];
        for (int64_t i = 0; i < spatial; ++i) {
          const int64_t at = first + k * spatial + i;
          dst[at] = static_cast<float>((src[at] - mean) * s + b);
        }
      }
    }
  });
  return OkStatus();
}

// ---- ReverseSequence ---------------------------------------------------------------------------

Status RunReverseSequence(int64_t batch_axis, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& lens = a.inputs[1];
  const size_t es = SizeOf(x.dtype);
  const int64_t d0 = x.dims[0], d1 = x.dims[1];
  const int64_t inner = d0 * d1 == 0 ? 0 : NumElements(x.dims) / (d0 * d1);
  const int64_t batch = batch_axis == 0 ? d0 : d1, time = batch_axis == 0 ? d1 : d0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = ReadInt(lens, b);
    if (len < 0 || len > time) {
      return MakeError(ErrorCode::kKernelFailed,
                       "sequence_lens[{}] is {}; it must be in [0, {}] (the time axis)", b, len,
                       time);
    }
  }
  const auto* src = static_cast<const std::byte*>(x.data);
  auto* dst = static_cast<std::byte*>(a.outputs[0].data);
  const size_t row = static_cast<size_t>(inner) * es;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = ReadInt(lens, b);
    for (int64_t t = 0; t < time; ++t) {
      const int64_t from = t < len ? len - 1 - t : t;
      auto at = [&](int64_t tt) {
        return static_cast<size_t>(batch_axis == 0 ? b * time + tt : tt * batch + b) * row;
      };
      std::memcpy(dst + at(t), src + at(from), row);
    }
  }
  return OkStatus();
}

// ---- AffineGrid --------------------------------------------------------------------------------

// The normalised base coordinate of index i of n points in [-1, 1].
double GridBase(int64_t i, int64_t n, bool align_corners) {
  if (align_corners)
    return n > 1 ? -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1) : -1.0;
  return -1.0 + (2.0 * static_cast<double>(i) + 1.0) / static_cast<double>(n);
}

Status RunAffineGrid(bool align_corners, const KernelRunArgs& a) {
  const TensorView& theta = a.inputs[0];
  const DimVec size = ReadInts(a.inputs[1]);
  const TensorView& y = a.outputs[0];
  const size_t r = size.size() - 2;  // 2 or 3 spatial axes
  if ((r != 2 && r != 3) || theta.dims.size() != 3 || theta.dims[1] != static_cast<int64_t>(r) ||
      theta.dims[2] != static_cast<int64_t>(r + 1) || y.dims.size() != r + 2) {
    return MakeError(ErrorCode::kShapeMismatch, "AffineGrid of theta [{}] and size [{}]",
                     fmt::join(theta.dims, "x"), fmt::join(size, ","));
  }
  const int64_t n = theta.dims[0];
  // Spatial extents D (3-D only), H, W; the grid's last axis lists x (W), y (H), z (D).
  const int64_t depth = r == 3 ? size[2] : 1, height = size[r], width = size[r + 1];
  bool fits = y.dims[0] == n && size[0] == n && y.dims.back() == static_cast<int64_t>(r);
  for (size_t i = 0; i < r; ++i) fits = fits && y.dims[i + 1] == size[i + 2];
  if (!fits) {
    return MakeError(ErrorCode::kShapeMismatch, "AffineGrid size [{}] does not fit the grid [{}]",
                     fmt::join(size, ","), fmt::join(y.dims, "x"));
  }
  const float* th = theta.as<const float>();
  float* out = y.as<float>();
  const int64_t points = depth * height * width;
  for (int64_t b = 0; b < n; ++b) {
    const float* t = th + b * static_cast<int64_t>(r * (r + 1));
    for (int64_t p = 0; p < points; ++p) {
      const int64_t w = p % width, h = p / width % height, d = p / (width * height);
      double base[4] = {GridBase(w, width, align_corners), GridBase(h, height, align_corners), 0,
                        0};
      if (r == 3) {
        base[2] = GridBase(d, depth, align_corners);
        base[3] = 1;
      } else {
        base[2] = 1;
      }
      for (size_t i = 0; i < r; ++i) {
        double acc = 0;
        for (size_t j = 0; j <= r; ++j) acc += t[i * (r + 1) + j] * base[j];
        out[(b * points + p) * static_cast<int64_t>(r) + static_cast<int64_t>(i)] =
            static_cast<float>(acc);
      }
    }
  }
  return OkStatus();
}

// ---- TensorScatter -----------------------------------------------------------------------------

Status RunTensorScatter(int64_t axis_attr, bool circular, const KernelRunArgs& a) {
  const TensorView& past = a.inputs[0];
  const TensorView& update = a.inputs[1];
  const bool has_indices = a.inputs.size() > 2 && a.inputs[2].data;
  const TensorView& y = a.outputs[0];
  const int64_t rank = static_cast<int64_t>(past.dims.size());
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  const size_t es = SizeOf(past.dtype);
  int64_t prefix = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) prefix *= past.dims[static_cast<size_t>(i)];
  for (int64_t i = axis + 1; i < rank; ++i) inner *= past.dims[static_cast<size_t>(i)];
  const int64_t max_len = past.dims[static_cast<size_t>(axis)];
  const int64_t seq = update.dims[static_cast<size_t>(axis)];
  const int64_t per_batch = past.dims[0] == 0 ? 0 : prefix / past.dims[0];
  if (y.data != past.data)
    std::memcpy(y.data, past.data, static_cast<size_t>(NumElements(past.dims)) * es);
  const auto* src = static_cast<const std::byte*>(update.data);
  auto* dst = static_cast<std::byte*>(y.data);
  const size_t row = static_cast<size_t>(inner) * es;
  for (int64_t p = 0; p < prefix; ++p) {
    const int64_t b = per_batch ? p / per_batch : 0;
    const int64_t start = has_indices ? ReadInt(a.inputs[2], b) : 0;
    for (int64_t s = 0; s < seq; ++s) {
      int64_t at = start + s;
      if (circular) at = ((at % max_len) + max_len) % max_len;
      if (at < 0 || at >= max_len) {
        return MakeError(ErrorCode::kKernelFailed,
                         "write index {} + {} of batch {} is outside the cache's {} positions "
                         "(mode linear)",
                         start, s, b, max_len);
      }
      std::memcpy(dst + static_cast<size_t>(p * max_len + at) * row,
                  src + static_cast<size_t>(p * seq + s) * row, row);
    }
  }
  return OkStatus();
}

// ---- MaxUnpool ---------------------------------------------------------------------------------

struct UnpoolSpec {
  std::vector<int64_t> kernel, strides, pads;
};

// As the ONNX reference: the indices address the tensor of the inferred shape
// ((D - 1) * stride - pads + kernel), which sits at the start of a larger output_shape.
Status RunMaxUnpool(const UnpoolSpec& s, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& idx = a.inputs[1];
  const TensorView& y = a.outputs[0];
  const size_t r = x.dims.size() - 2;
  DimVec inferred(x.dims.size(), 0);
  inferred[0] = x.dims[0];
  inferred[1] = x.dims[1];
  for (size_t i = 0; i < r; ++i) {
    const int64_t stride = s.strides.empty() ? 1 : s.strides[i];
    const int64_t pads = s.pads.empty() ? 0 : s.pads[i] + s.pads[i + r];
    inferred[i + 2] = (x.dims[i + 2] - 1) * stride - pads + s.kernel[i];
  }
  for (size_t i = 0; i < y.dims.size(); ++i) {
    if (y.dims[i] < inferred[i]) {
      return MakeError(ErrorCode::kShapeMismatch, "MaxUnpool output [{}] is smaller than [{}]",
                       fmt::join(y.dims, "x"), fmt::join(inferred, "x"));
    }
  }
  const int64_t total = NumElements(std::span<const int64_t>(inferred.data(), inferred.size()));
  const float* src = x.as<const float>();
  float* dst = y.as<float>();
  std::fill(dst, dst + NumElements(y.dims), 0.f);
  const int64_t count = NumElements(x.dims);
  for (int64_t e = 0; e < count; ++e) {
    int64_t i = ReadInt(idx, e);
    if (i < 0 || i >= total) {
      return MakeError(ErrorCode::kKernelFailed,
                       "MaxUnpool index {} is outside the unpooled tensor of {} elements", i,
                       total);
    }
    // Coordinates in the inferred shape, then the offset in the output's.
    int64_t off = 0, stride = 1;
    for (size_t k = inferred.size(); k-- > 0;) {
      off += (i % inferred[k]) * stride;
      i /= inferred[k];
      stride *= y.dims[k];
    }
    dst[off] = src[e];
  }
  return OkStatus();
}

// ---- DeformConv --------------------------------------------------------------------------------

// Bilinear sample of a [height, width] plane at (y, x); corners outside read 0 (GridSample with
// align_corners and zeros padding, as the spec's reference samples).
double SampleZeros(const float* plane, int64_t height, int64_t width, double y, double x) {
  const double y0 = std::floor(y), x0 = std::floor(x);
  const double ly = y - y0, lx = x - x0;
  double acc = 0;
  for (int dy = 0; dy < 2; ++dy) {
    for (int dx = 0; dx < 2; ++dx) {
      const int64_t yi = static_cast<int64_t>(y0) + dy, xi = static_cast<int64_t>(x0) + dx;
      if (yi < 0 || yi >= height || xi < 0 || xi >= width) continue;
      acc += (dy ? ly : 1 - ly) * (dx ? lx : 1 - lx) * plane[yi * width + xi];
    }
  }
  return acc;
}

Status RunDeformConv(const nn::WindowAttrs& at, int64_t offset_group, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& w = a.inputs[1];
  const TensorView& off = a.inputs[2];
  const bool has_bias = a.inputs.size() > 3 && a.inputs[3].data;
  const bool has_mask = a.inputs.size() > 4 && a.inputs[4].data;
  const TensorView& y = a.outputs[0];
  const int64_t n = x.dims[0], cin = x.dims[1], ih = x.dims[2], iw = x.dims[3];
  const int64_t cout = w.dims[0], cg = w.dims[1], kh = w.dims[2], kw = w.dims[3];
  const int64_t oh = y.dims[2], ow = y.dims[3], taps = kh * kw;
  const int64_t mg = cout / at.group, per_offset_group = cin / offset_group;
  const int64_t pad_h = nn::WindowPadBegin(ih, oh, at, 0),
                pad_w = nn::WindowPadBegin(iw, ow, at, 1);
  const float* xs = x.as<const float>();
  const float* ws = w.as<const float>();
  const float* os = off.as<const float>();
  const float* bs = has_bias ? a.inputs[3].as<const float>() : nullptr;
  const float* ms = has_mask ? a.inputs[4].as<const float>() : nullptr;
  float* dst = y.as<float>();
  ParallelRows(n * cout, oh * ow * cg * taps * 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / cout, m = r % cout, g = m / mg;
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double acc = bs ? bs[m] : 0.0;
          for (int64_t c = 0; c < cg; ++c) {
            const int64_t ch = g * cg + c, og = ch / per_offset_group;
            const float* plane = xs + (b * cin + ch) * ih * iw;
            for (int64_t t = 0; t < taps; ++t) {
              const int64_t ki = t / kw, kj = t % kw;
              // offset [N, og, kH, kW, 2, oH, oW]; mask [N, og, kH, kW, oH, oW].
              const int64_t obase = ((b * offset_group + og) * taps + t) * 2;
              const double dy = os[(obase * oh + i) * ow + j];
              const double dx = os[((obase + 1) * oh + i) * ow + j];
              const double py =
                  static_cast<double>(i * at.strides[0] - pad_h + ki * at.dilations[0]) + dy;
              const double px =
                  static_cast<double>(j * at.strides[1] - pad_w + kj * at.dilations[1]) + dx;
              double v = SampleZeros(plane, ih, iw, py, px) * ws[(m * cg + c) * taps + t];
              if (ms) v *= ms[(((b * offset_group + og) * taps + t) * oh + i) * ow + j];
              acc += v;
            }
          }
          dst[(r * oh + i) * ow + j] = static_cast<float>(acc);
        }
      }
    }
  });
  return OkStatus();
}

// ---- RoiAlign ----------------------------------------------------------------------------------

struct RoiAlignSpec {
  bool half_pixel = true, max = false;
  int64_t sampling_ratio = 0;
  float spatial_scale = 1.0f;
};

// As the ONNX reference (and ONNX Runtime): a regular grid of bilinear samples per bin, averaged
// or, for max, the largest weighted corner of each sample.
Status RunRoiAlign(const RoiAlignSpec& s, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& rois = a.inputs[1];
  const TensorView& idx = a.inputs[2];
  const TensorView& y = a.outputs[0];
  const int64_t batch = x.dims[0], channels = x.dims[1], height = x.dims[2], width = x.dims[3];
  const int64_t n_rois = y.dims[0], ph_n = y.dims[2], pw_n = y.dims[3];
  const float* xs = x.as<const float>();
  const float* rs = rois.as<const float>();
  float* dst = y.as<float>();
  // Samples per bin are at most this many along an axis (sampling_ratio 0 takes ceil(roi size /
  // bins): a roi of 1e30 pixels would sample for ever).
  constexpr double kMaxGrid = 1 << 16;
  for (int64_t r = 0; r < n_rois; ++r) {
    const int64_t b = ReadInt(idx, r);
    if (b < 0 || b >= batch) {
      return MakeError(ErrorCode::kKernelFailed, "batch_indices[{}] is {}; X has {} images", r, b,
                       batch);
    }
    for (int k = 0; k < 4; ++k) {
      const double v = rs[r * 4 + k] * static_cast<double>(s.spatial_scale);
      if (!std::isfinite(v) || std::fabs(v) > kMaxGrid * static_cast<double>(ph_n + pw_n)) {
        return MakeError(ErrorCode::kKernelFailed,
                         "roi {} coordinate {} is {} (scaled); it must be finite and within {}", r,
                         k, v, kMaxGrid * static_cast<double>(ph_n + pw_n));
      }
    }
  }
  ParallelRows(n_rois * channels, ph_n * pw_n * 16, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t r = q / channels, c = q % channels;
      const double offset = s.half_pixel ? 0.5 : 0.0;
      const double x0 = rs[r * 4 + 0] * s.spatial_scale - offset;
      const double y0 = rs[r * 4 + 1] * s.spatial_scale - offset;
      const double x1 = rs[r * 4 + 2] * s.spatial_scale - offset;
      const double y1 = rs[r * 4 + 3] * s.spatial_scale - offset;
      double roi_w = x1 - x0, roi_h = y1 - y0;
      if (!s.half_pixel) {
        roi_w = std::max(roi_w, 1.0);
        roi_h = std::max(roi_h, 1.0);
      }
      const double bin_h = roi_h / static_cast<double>(ph_n),
                   bin_w = roi_w / static_cast<double>(pw_n);
      const int64_t grid_h =
          s.sampling_ratio > 0 ? s.sampling_ratio
                               : static_cast<int64_t>(std::ceil(roi_h / static_cast<double>(ph_n)));
      const int64_t grid_w =
          s.sampling_ratio > 0 ? s.sampling_ratio
                               : static_cast<int64_t>(std::ceil(roi_w / static_cast<double>(pw_n)));
      const double count = static_cast<double>(std::max<int64_t>(grid_h * grid_w, 1));
      const float* plane = xs + (ReadInt(idx, r) * channels + c) * height * width;
      for (int64_t ph = 0; ph < ph_n; ++ph) {
        for (int64_t pw = 0; pw < pw_n; ++pw) {
          double out = 0;
          bool first = true;
          for (int64_t iy = 0; iy < grid_h; ++iy) {
            const double yy = y0 + static_cast<double>(ph) * bin_h +
                              (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(grid_h);
            for (int64_t ix = 0; ix < grid_w; ++ix) {
              const double xx =
                  x0 + static_cast<double>(pw) * bin_w +
                  (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(grid_w);
              double v[4] = {0, 0, 0, 0};
              if (!(yy < -1.0 || yy > static_cast<double>(height) || xx < -1.0 ||
                    xx > static_cast<double>(width))) {
                double py = std::max(yy, 0.0), px = std::max(xx, 0.0);
                int64_t yl = static_cast<int64_t>(py), xl = static_cast<int64_t>(px), yh, xh;
                if (yl >= height - 1) {
                  yh = yl = height - 1;
                  py = static_cast<double>(yl);
                } else {
                  yh = yl + 1;
                }
                if (xl >= width - 1) {
                  xh = xl = width - 1;
                  px = static_cast<double>(xl);
                } else {
                  xh = xl + 1;
                }
                const double ly = py - static_cast<double>(yl), lx = px - static_cast<double>(xl);
                v[0] = (1 - ly) * (1 - lx) * plane[yl * width + xl];
                v[1] = (1 - ly) * lx * plane[yl * width + xh];
                v[2] = ly * (1 - lx) * plane[yh * width + xl];
                v[3] = ly * lx * plane[yh * width + xh];
              }
              if (s.max) {
                const double m = std::max(std::max(v[0], v[1]), std::max(v[2], v[3]));
                out = first ? m : std::max(out, m);
                first = false;
              } else {
                out += v[0] + v[1] + v[2] + v[3];
              }
            }
          }
          dst[(q * ph_n + ph) * pw_n + pw] = static_cast<float>(s.max ? out : out / count);
        }
      }
    }
  });
  return OkStatus();
}

// ---- MaxPool with Indices, and of int8/uint8 ---------------------------------------------------

// A direct max pool (1-D to 3-D windows) that also writes, when asked, each maximum's position
// in the flattened input: plane offset + (d * H + h) * W + w, or with storage_order 1 the
// column-major position within the plane (w * H + h for 2-D). The first maximum wins ties, as
// ONNX Runtime's.
template <typename T>
void MaxPoolIndexed(const nn::WindowAttrs& at, bool col_major, const TensorView& x,
                    const TensorView& y, int64_t* indices) {
  const size_t r = x.dims.size() - 2;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1},
          d[3] = {1, 1, 1}, p[3] = {0, 0, 0};
  for (size_t i = 0; i < r; ++i) {
    const size_t a = 3 - r + i;
    in[a] = x.dims[i + 2];
    out[a] = y.dims[i + 2];
    k[a] = at.kernel[i];
    s[a] = at.strides[i];
    d[a] = at.dilations[i];
    p[a] = nn::WindowPadBegin(in[a], out[a], at, i);
  }
  const int64_t planes = x.dims[0] * x.dims[1];
  const int64_t in_plane = in[0] * in[1] * in[2], out_plane = out[0] * out[1] * out[2];
  const T* src = x.as<const T>();
  T* dst = y.as<T>();
  ParallelRows(planes, out_plane * k[0] * k[1] * k[2], [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const T* plane = src + pl * in_plane;
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t oz = o / (out[1] * out[2]), oy = o / out[2] % out[1], ox = o % out[2];
        bool found = false;
        T best{};
        int64_t at_best = 0;
        for (int64_t kz = 0; kz < k[0]; ++kz) {
          const int64_t iz = oz * s[0] - p[0] + kz * d[0];
          if (iz < 0 || iz >= in[0]) continue;
          for (int64_t ky = 0; ky < k[1]; ++ky) {
            const int64_t iy = oy * s[1] - p[1] + ky * d[1];
            if (iy < 0 || iy >= in[1]) continue;
            for (int64_t kx = 0; kx < k[2]; ++kx) {
              const int64_t ix = ox * s[2] - p[2] + kx * d[2];
              if (ix < 0 || ix >= in[2]) continue;
              const T v = plane[(iz * in[1] + iy) * in[2] + ix];
              if (!found || v > best) {
                best = v;
                found = true;
                at_best =
                    col_major ? (ix * in[1] + iy) * in[0] + iz : (iz * in[1] + iy) * in[2] + ix;
              }
            }
          }
        }
        dst[pl * out_plane + o] = best;
        if (indices) indices[pl * out_plane + o] = pl * in_plane + at_best;
      }
    }
  });
}

Status RunMaxPoolIndexed(const nn::WindowAttrs& at, bool col_major, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& y = a.outputs[0];
  const size_t r = x.dims.size() - 2;
  for (size_t i = 0; i < r; ++i) {
    if (nn::WindowOutDim<int64_t>(x.dims[i + 2], at, i) != y.dims[i + 2]) {
      return MakeError(ErrorCode::kShapeMismatch, "MaxPool of [{}] into [{}]",
                       fmt::join(x.dims, "x"), fmt::join(y.dims, "x"));
    }
  }
  int64_t* indices = a.outputs.size() > 1 ? a.outputs[1].as<int64_t>() : nullptr;
  switch (x.dtype) {
    case DataType::kUInt8:
      MaxPoolIndexed<uint8_t>(at, col_major, x, y, indices);
      break;
    case DataType::kInt8:
      MaxPoolIndexed<int8_t>(at, col_major, x, y, indices);
      break;
    default:
      MaxPoolIndexed<float>(at, col_major, x, y, indices);
  }
  return OkStatus();
}

// ---- BatchNormalization, training mode ---------------------------------------------------------

// y = scale * (x - mean_b) / sqrt(var_b + epsilon) + B with the batch's per-channel mean and
// (population) variance; outputs 1 and 2, when present, are the running statistics
// input * momentum + batch * (1 - momentum).
Status RunBatchNormTraining(float epsilon, float momentum, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const int64_t n = x.dims[0], c = x.dims[1];
  const int64_t spatial = n * c == 0 ? 0 : NumElements(x.dims) / (n * c);
  const float* src = x.as<const float>();
  const float* scale = a.inputs[1].as<const float>();
  const float* bias = a.inputs[2].as<const float>();
  const float* mean_in = a.inputs[3].as<const float>();
  const float* var_in = a.inputs[4].as<const float>();
  float* dst = a.outputs[0].as<float>();
  float* mean_out = a.outputs.size() > 1 && a.outputs[1].data ? a.outputs[1].as<float>() : nullptr;
  float* var_out = a.outputs.size() > 2 && a.outputs[2].data ? a.outputs[2].as<float>() : nullptr;
  const double count = static_cast<double>(n * spatial);
  ParallelRows(c, n * spatial * 3, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t b = 0; b < n; ++b) {
        const float* p = src + (b * c + ch) * spatial;
        for (int64_t i = 0; i < spatial; ++i) sum += p[i];
      }
      const double mean = count > 0 ? sum / count : 0.0;
      for (int64_t b = 0; b < n; ++b) {
        const float* p = src + (b * c + ch) * spatial;
        for (int64_t i = 0; i < spatial; ++i) sq += (p[i] - mean) * (p[i] - mean);
      }
      const double var = count > 0 ? sq / count : 0.0;
      const double k = scale[ch] / std::sqrt(var + static_cast<double>(epsilon));
      for (int64_t b = 0; b < n; ++b) {
        const int64_t at = (b * c + ch) * spatial;
        for (int64_t i = 0; i < spatial; ++i) {
          dst[at + i] = static_cast<float>((src[at + i] - mean) * k + bias[ch]);
        }
      }
      if (mean_out)
        mean_out[ch] = static_cast<float>(mean_in[ch] * momentum + mean * (1 - momentum));
      if (var_out) var_out[ch] = static_cast<float>(var_in[ch] * momentum + var * (1 - momentum));
    }
  });
  return OkStatus();
}

// ---- MatMulInteger and ConvInteger -------------------------------------------------------------

int32_t Load8(const TensorView& v, int64_t i) {
  return v.dtype == DataType::kUInt8 ? static_cast<int32_t>(v.as<const uint8_t>()[i])
                                     : static_cast<int32_t>(v.as<const int8_t>()[i]);
}

// Zero point for position i of a per-element vector, or the scalar (0 when absent).
int32_t ZeroPoint(std::span<const TensorView> in, size_t k, int64_t i) {
  if (in.size() <= k || !in[k].data) return 0;
  return Load8(in[k], NumElements(in[k].dims) == 1 ? 0 : i);
}

Status RunMatMulInteger(const KernelRunArgs& a) {
  const TensorView& av = a.inputs[0];
  const TensorView& bv = a.inputs[1];
  const TensorView& y = a.outputs[0];
  // 1-D operands as [1, K] and [K, 1] (their unit axis is not in the output).
  std::vector<int64_t> ad(av.dims.begin(), av.dims.end()), bd(bv.dims.begin(), bv.dims.end());
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  const int64_t m = ad[ad.size() - 2], k = ad.back(), n = bd.back();
  if (bd[bd.size() - 2] != k) {
    return MakeError(ErrorCode::kShapeMismatch, "MatMulInteger of [{}] and [{}]",
                     fmt::join(av.dims, "x"), fmt::join(bv.dims, "x"));
  }
  // Batch dims broadcast to the longest.
  const size_t batch_rank = std::max(ad.size(), bd.size()) - 2;
  std::vector<int64_t> batch(batch_rank, 1);
  auto bdim = [&](const std::vector<int64_t>& d,
                  size_t i) -> int64_t {  // i counts from the batch's left
    const size_t off = batch_rank - (d.size() - 2);
    return i < off ? 1 : d[i - off];
  };
  int64_t batches = 1;
  for (size_t i = 0; i < batch_rank; ++i) {
    batch[i] = std::max(bdim(ad, i), bdim(bd, i));
    batches *= batch[i];
  }
  int32_t* out = y.as<int32_t>();
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t a_off = 0, b_off = 0, a_stride = 1, b_stride = 1, rest = bi;
    for (size_t i = batch_rank; i-- > 0;) {
      const int64_t c = rest % batch[i];
      rest /= batch[i];
      const int64_t da = bdim(ad, i), db = bdim(bd, i);
      a_off += (da == 1 ? 0 : c) * a_stride;
      b_off += (db == 1 ? 0 : c) * b_stride;
      a_stride *= da;
      b_stride *= db;
    }
    for (int64_t i = 0; i < m; ++i) {
      const int32_t za = ZeroPoint(a.inputs, 2, i);
      for (int64_t j = 0; j < n; ++j) {
        const int32_t zb = ZeroPoint(a.inputs, 3, j);
        int32_t acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          acc +=
              (Load8(av, (a_off * m + i) * k + p) - za) * (Load8(bv, (b_off * k + p) * n + j) - zb);
        }
        out[(bi * m + i) * n + j] = acc;
      }
    }
  }
  return OkStatus();
}

Status RunConvInteger(const nn::WindowAttrs& attrs, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& w = a.inputs[1];
  const TensorView& y = a.outputs[0];
  const size_t r = x.dims.size() - 2;
  if (r > 3 || w.dims.size() != x.dims.size() || y.dims.size() != x.dims.size()) {
    return MakeError(ErrorCode::kShapeMismatch, "ConvInteger of [{}] with weight [{}]",
                     fmt::join(x.dims, "x"), fmt::join(w.dims, "x"));
  }
  const int64_t batch = x.dims[0], cin = x.dims[1], cout = w.dims[0], group = attrs.group;
  const int64_t cg = cin / group, mg = cout / group;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, ker[3] = {1, 1, 1}, pad[3] = {0, 0, 0},
          str[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  for (size_t i = 0; i < r; ++i) {
    const size_t s = 3 - r + i;  // right-aligned into 3 axes
    in[s] = x.dims[i + 2];
    out[s] = y.dims[i + 2];
    ker[s] = w.dims[i + 2];
    str[s] = attrs.strides[i];
    dil[s] = attrs.dilations[i];
    pad[s] = nn::WindowPadBegin(in[s], out[s], attrs, i);
  }
  const int32_t zx = ZeroPoint(a.inputs, 2, 0);
  int32_t* dst = y.as<int32_t>();
  const int64_t in_plane = in[0] * in[1] * in[2], out_plane = out[0] * out[1] * out[2];
  const int64_t ksize = ker[0] * ker[1] * ker[2];
  ParallelRows(batch * cout, out_plane * cg * ksize, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t b = row / cout, m = row % cout, g = m / mg;
      const int32_t zw = ZeroPoint(a.inputs, 3, m);
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t od = o / (out[1] * out[2]), oh = o / out[2] % out[1], ow = o % out[2];
        int32_t acc = 0;
        for (int64_t c = 0; c < cg; ++c) {
          const int64_t xc = (b * cin + g * cg + c) * in_plane;
          const int64_t wc = (m * cg + c) * ksize;
          for (int64_t kd = 0; kd < ker[0]; ++kd) {
            const int64_t id = od * str[0] - pad[0] + kd * dil[0];
            for (int64_t kh = 0; kh < ker[1]; ++kh) {
              const int64_t ih = oh * str[1] - pad[1] + kh * dil[1];
              for (int64_t kw = 0; kw < ker[2]; ++kw) {
                const int64_t iw = ow * str[2] - pad[2] + kw * dil[2];
                // Padding holds the zero point: it contributes (zx - zx) * w = 0.
                if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2]) {
                  continue;
                }
                const int32_t xv = Load8(x, xc + (id * in[1] + ih) * in[2] + iw) - zx;
                const int32_t wv = Load8(w, wc + (kd * ker[1] + kh) * ker[2] + kw) - zw;
                acc += xv * wv;
              }
            }
          }
        }
        dst[row * out_plane + o] = acc;
      }
    }
  });
  return OkStatus();
}

bool Is8Bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

bool OptionalZeroPoint(const KernelRequest& r, size_t i, size_t data) {
  return InType(r, i) == DataType::kUndefined || InType(r, i) == InType(r, data);
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Det",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 || InType(r, 0) == DataType::kFloat64;
          },
      .create = [](const KernelRequest&) { return KernelOr(RunDet); },
  });
  RegisterOpKernel({
      .op_type = "GroupNormalization",
      .accepts = [](const KernelRequest& r) { return InType(r, 0) == DataType::kFloat32; },
      .create =
          [](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            const int64_t groups = at.GetInt("num_groups", 1);
            const float eps = attrs::GroupNormalization::epsilon(at);
            return KernelOr(
                [groups, eps](const KernelRunArgs& a) { return RunGroupNorm(groups, eps, a); });
          },
  });
  RegisterOpKernel({
      .op_type = "ReverseSequence",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return IsIndexType(InType(r, 1)); },
      .create =
          [](const KernelRequest& r) {
            const int64_t batch_axis = attrs::ReverseSequence::batch_axis(r.node->attrs());
            return KernelOr(
                [batch_axis](const KernelRunArgs& a) { return RunReverseSequence(batch_axis, a); });
          },
  });
  RegisterOpKernel({
      .op_type = "AffineGrid",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && IsIndexType(InType(r, 1));
          },
      .create =
          [](const KernelRequest& r) {
            const bool align = attrs::AffineGrid::align_corners(r.node->attrs()) != 0;
            return KernelOr([align](const KernelRunArgs& a) { return RunAffineGrid(align, a); });
          },
  });
  RegisterOpKernel({
      .op_type = "TensorScatter",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 2) == DataType::kUndefined || IsIndexType(InType(r, 2));
          },
      .create =
          [](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            const int64_t axis = attrs::TensorScatter::axis(at);
            const bool circular = attrs::TensorScatter::mode(at) == "circular";
            return KernelOr([axis, circular](const KernelRunArgs& a) {
              return RunTensorScatter(axis, circular, a);
            });
          },
  });
  RegisterOpKernel({
      .op_type = "MaxUnpool",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && InType(r, 1) == DataType::kInt64;
          },
      .create =
          [](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            UnpoolSpec spec{at.GetInts("kernel_shape"), attrs::MaxUnpool::strides(at),
                            attrs::MaxUnpool::pads(at)};
            return KernelOr([spec](const KernelRunArgs& a) { return RunMaxUnpool(spec, a); });
          },
  });
  RegisterOpKernel({
      .op_type = "MatMulInteger",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return Is8Bit(InType(r, 0)) && Is8Bit(InType(r, 1)) && OptionalZeroPoint(r, 2, 0) &&
                   OptionalZeroPoint(r, 3, 1) && OutType(r, 0) == DataType::kInt32;
          },
      .create = [](const KernelRequest&) { return KernelOr(RunMatMulInteger); },
  });
  RegisterOpKernel({
      .op_type = "ConvInteger",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return Is8Bit(InType(r, 0)) && Is8Bit(InType(r, 1)) && OptionalZeroPoint(r, 2, 0) &&
                   OptionalZeroPoint(r, 3, 1) && OutType(r, 0) == DataType::kInt32 &&
                   r.inputs[0].shape.size() >= 3 && r.inputs[0].shape.size() <= 5;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> kernel;
        for (size_t i = 2; i < r.inputs[1].shape.size(); ++i) {
          if (!r.inputs[1].shape[i].is_static()) {
            return MakeError(ErrorCode::kShapeMismatch, "ConvInteger weight dims must be static");
          }
          kernel.push_back(r.inputs[1].shape[i].value());
        }
        KILN_ASSIGN_OR_RETURN(nn::WindowAttrs attrs,
                              nn::ReadWindowAttrs(r.node->attrs(), kernel.size(), kernel));
        return KernelOr([attrs](const KernelRunArgs& a) { return RunConvInteger(attrs, a); });
      },
  });
  RegisterOpKernel({
      .op_type = "DeformConv",
      .accepts =
          [](const KernelRequest& r) {
            for (size_t i = 0; i < r.inputs.size(); ++i) {
              if (InType(r, i) != DataType::kFloat32 && InType(r, i) != DataType::kUndefined) {
                return false;
              }
            }
            return r.inputs[0].shape.size() == 4;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> kernel;
        for (size_t i = 2; i < r.inputs[1].shape.size(); ++i) {
          kernel.push_back(r.inputs[1].shape[i].value());
        }
        KILN_ASSIGN_OR_RETURN(nn::WindowAttrs attrs,
                              nn::ReadWindowAttrs(r.node->attrs(), kernel.size(), kernel));
        const int64_t groups = attrs::DeformConv::offset_group(r.node->attrs());
        return KernelOr(
            [attrs, groups](const KernelRunArgs& a) { return RunDeformConv(attrs, groups, a); });
      },
  });
  RegisterOpKernel({
      .op_type = "RoiAlign",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && InType(r, 1) == DataType::kFloat32 &&
                   IsIndexType(InType(r, 2));
          },
      .create =
          [](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            RoiAlignSpec spec{attrs::RoiAlign::coordinate_transformation_mode(at) == "half_pixel",
                              attrs::RoiAlign::mode(at) == "max",
                              attrs::RoiAlign::sampling_ratio(at),
                              attrs::RoiAlign::spatial_scale(at)};
            return KernelOr([spec](const KernelRunArgs& a) { return RunRoiAlign(spec, a); });
          },
  });
  // MaxPool's forms the float pool kernel (pool.cc) does not take: an Indices output, or
  // int8/uint8 values.
  RegisterOpKernel({
      .op_type = "MaxPool",
      .variant = "indexed",
      .accepts =
          [](const KernelRequest& r) {
            const DataType t = InType(r, 0);
            const size_t rank = r.inputs[0].shape.size();
            return (r.outputs.size() == 2 || Is8Bit(t)) && (t == DataType::kFloat32 || Is8Bit(t)) &&
                   rank >= 3 && rank <= 5 && !IsChannelsLast(r.node->attrs()) &&
                   (r.outputs.size() == 1 || OutType(r, 1) == DataType::kInt64);
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(
            nn::WindowAttrs attrs,
            nn::ReadWindowAttrs(r.node->attrs(), r.inputs[0].shape.size() - 2, {}));
        const bool col_major = attrs::MaxPool::storage_order(r.node->attrs()) == 1;
        return KernelOr([attrs, col_major](const KernelRunArgs& a) {
          return RunMaxPoolIndexed(attrs, col_major, a);
        });
      },
  });
  RegisterOpKernel({
      .op_type = "BatchNormalization",
      .variant = "training",
      .accepts =
          [](const KernelRequest& r) {
            if (attrs::BatchNormalization::training_mode(*r.node) == 0 ||
                IsChannelsLast(r.node->attrs()) || r.inputs.size() != 5) {
              return false;
            }
            for (size_t i = 0; i < 5; ++i) {
              if (InType(r, i) != DataType::kFloat32) return false;
            }
            for (size_t i = 1; i < r.outputs.size(); ++i) {
              if (OutType(r, i) != DataType::kFloat32) return false;
            }
            return true;
          },
      .create =
          [](const KernelRequest& r) {
            const float eps = attrs::BatchNormalization::epsilon(*r.node);
            const float momentum = attrs::BatchNormalization::momentum(*r.node);
            return KernelOr([eps, momentum](const KernelRunArgs& a) {
              return RunBatchNormTraining(eps, momentum, a);
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
