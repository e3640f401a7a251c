// Signal-processing ops on the CPU: DFT, STFT, the Hann/Hamming/Blackman windows and
// MelWeightMatrix. The transforms are direct sums in double precision over a table of the N
// twiddle factors (O(N^2) per line: exact and simple; long transforms would want an FFT).
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// cos and sin of 2 pi j / n for j in [0, n).
struct Twiddles {
  explicit Twiddles(int64_t n) : n(n), c(static_cast<size_t>(n)), s(static_cast<size_t>(n)) {
    for (int64_t j = 0; j < n; ++j) {
      const double a = 2 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
      c[static_cast<size_t>(j)] = std::cos(a);
      s[static_cast<size_t>(j)] = std::sin(a);
    }
  }
  // e^{sign * 2 pi i k t / n} as (re, im).
  double cos_at(int64_t k, int64_t t) const { return c[static_cast<size_t>(k * t % n)]; }
  double sin_at(int64_t k, int64_t t) const { return s[static_cast<size_t>(k * t % n)]; }
  int64_t n;
  std::vector<double> c, s;
};

struct DftSpec {
  bool inverse = false, onesided = false;
};

Status RunDft(const DftSpec& spec, const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& y = a.outputs[0];
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  int64_t axis = a.inputs.size() > 2 && a.inputs[2].data ? ReadInt(a.inputs[2], 0) : -2;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank - 1 || y.dims.size() != x.dims.size()) {
    return MakeError(ErrorCode::kShapeMismatch, "DFT axis {} of an input of rank {}", axis, rank);
  }
  const int64_t n_in = x.dims[static_cast<size_t>(axis)];
  const int64_t m_out = y.dims[static_cast<size_t>(axis)];
  const int64_t c_in = x.dims.back(), c_out = y.dims.back();
  int64_t n = a.inputs.size() > 1 && a.inputs[1].data
                  ? ReadInt(a.inputs[1], 0)
                  : (spec.inverse && spec.onesided ? 2 * (n_in - 1) : n_in);
  const int64_t expect_out = !spec.inverse && spec.onesided ? n / 2 + 1 : n;
  if (n < 1 || m_out != expect_out || (c_in != 1 && c_in != 2) ||
      c_out != (spec.inverse && spec.onesided ? 1 : 2)) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "DFT of length {} along axis {}: input {} and output {} do not fit", n, axis,
                     fmt::join(x.dims, "x"), fmt::join(y.dims, "x"));
  }
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dims[static_cast<size_t>(i)];
  for (int64_t i = axis + 1; i < rank - 1; ++i) inner *= x.dims[static_cast<size_t>(i)];
  const Twiddles tw(n);
  const float* src = x.as<const float>();
  float* dst = y.as<float>();
  const int64_t used = std::min(n_in, spec.inverse && spec.onesided ? n / 2 + 1 : n);
  ParallelRows(outer * inner, n * m_out, [&](int64_t l0, int64_t l1) {
    std::vector<double> re(static_cast<size_t>(used)), im(static_cast<size_t>(used));
    for (int64_t l = l0; l < l1; ++l) {
      const int64_t o = l / inner, i = l % inner;
      for (int64_t k = 0; k < used; ++k) {
        const float* p = src + ((o * n_in + k) * inner + i) * c_in;
        re[static_cast<size_t>(k)] = p[0];
        im[static_cast<size_t>(k)] = c_in == 2 ? p[1] : 0.0;
      }
      for (int64_t f = 0; f < m_out; ++f) {
        float* q = dst + ((o * m_out + f) * inner + i) * c_out;
        if (spec.inverse && spec.onesided) {
          // Real output of the Hermitian spectrum whose first n / 2 + 1 values are given (as
          // numpy's irfft: the imaginary parts of the DC and Nyquist terms are dropped).
          double acc = used > 0 ? re[0] : 0.0;
          for (int64_t k = 1; k < used && 2 * k < n; ++k) {
            acc += 2 * (re[static_cast<size_t>(k)] * tw.cos_at(k, f) -
                        im[static_cast<size_t>(k)] * tw.sin_at(k, f));
          }
          if (n % 2 == 0 && n / 2 < used) {
            acc += re[static_cast<size_t>(n / 2)] * (f % 2 == 0 ? 1.0 : -1.0);
          }
          q[0] = static_cast<float>(acc / static_cast<double>(n));
          continue;
        }
        const double sign = spec.inverse ? 1.0 : -1.0;
        double ar = 0, ai = 0;
        for (int64_t k = 0; k < used; ++k) {
          const double c = tw.cos_at(k, f), s = sign * tw.sin_at(k, f);
          const double xr = re[static_cast<size_t>(k)], xi = im[static_cast<size_t>(k)];
          ar += xr * c - xi * s;
          ai += xr * s + xi * c;
        }
        const double scale = spec.inverse ? 1.0 / static_cast<double>(n) : 1.0;
        q[0] = static_cast<float>(ar * scale);
        q[1] = static_cast<float>(ai * scale);
      }
    }
  });
  return OkStatus();
}

// STFT: frames of frame_length samples every frame_step, weighted by the window (ones when
// absent), each transformed; output [batch, frames, bins, 2].
Status RunStft(const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& y = a.outputs[0];
  const bool has_window = a.inputs.size() > 2 && a.inputs[2].data;
  const int64_t batch = x.dims[0], length = x.dims[1], c_in = x.dims[2];
  const int64_t step = ReadInt(a.inputs[1], 0);
  const int64_t w = a.inputs.size() > 3 && a.inputs[3].data ? ReadInt(a.inputs[3], 0)
                    : has_window                            ? a.inputs[2].dims[0]
                                                            : length;
  const int64_t frames = y.dims[1], bins = y.dims[2];
  if (step < 1 || w < 1 || (frames - 1) * step + w > length || bins > w ||
      (has_window && a.inputs[2].dims[0] != w)) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "STFT frames of {} every {} over {} samples do not fit the output [{}]", w,
                     step, length, fmt::join(y.dims, "x"));
  }
  const Twiddles tw(w);
  const float* src = x.as<const float>();
  const float* win = has_window ? a.inputs[2].as<const float>() : nullptr;
  float* dst = y.as<float>();
  ParallelRows(batch * frames, w * bins, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / frames, f = r % frames;
      const float* frame = src + (b * length + f * step) * c_in;
      for (int64_t k = 0; k < bins; ++k) {
        double ar = 0, ai = 0;
        for (int64_t t = 0; t < w; ++t) {
          const double wt = win ? win[t] : 1.0;
          const double xr = frame[t * c_in] * wt, xi = c_in == 2 ? frame[t * c_in + 1] * wt : 0.0;
          const double c = tw.cos_at(k, t), s = -tw.sin_at(k, t);
          ar += xr * c - xi * s;
          ai += xr * s + xi * c;
        }
        float* q = dst + (r * bins + k) * 2;
        q[0] = static_cast<float>(ar);
        q[1] = static_cast<float>(ai);
      }
    }
  });
  return OkStatus();
}

enum class Window { kHann, kHamming, kBlackman };

// The window's value at n of `size` (periodic: the denominator is size, else size - 1).
double WindowValue(Window kind, int64_t n, int64_t size, bool periodic) {
  const int64_t denom = periodic ? size : size - 1;
  if (denom <= 0) return 1.0;  // a one-point symmetric window (as torch's)
  const double t = 2 * std::numbers::pi * static_cast<double>(n) / static_cast<double>(denom);
  switch (kind) {
    case Window::kHann:
      return 0.5 - 0.5 * std::cos(t);
    case Window::kHamming:
      return 25.0 / 46.0 - (21.0 / 46.0) * std::cos(t);
    case Window::kBlackman:
      return 0.42 - 0.5 * std::cos(t) + 0.08 * std::cos(2 * t);
  }
  return 0;
}

Status RunWindow(Window kind, bool periodic, const KernelRunArgs& a) {
  const TensorView& y = a.outputs[0];
  const int64_t size = ReadInt(a.inputs[0], 0);
  if (y.dims.size() != 1 || y.dims[0] != size) {
    return MakeError(ErrorCode::kShapeMismatch, "window of size {} into an output of [{}]", size,
                     fmt::join(y.dims, "x"));
  }
  return DispatchNumeric(y.dtype, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    T* out = y.as<T>();
    for (int64_t n = 0; n < size; ++n)
      out[n] = static_cast<T>(WindowValue(kind, n, size, periodic));
    return OkStatus();
  });
}

// MelWeightMatrix as the ONNX reference computes it: num_mel_bins + 2 points evenly spaced in mel
// between the edges, mapped to DFT bins floor((dft_length + 1) * hz / sample_rate), and
// triangles between neighbouring points.
Status RunMelWeightMatrix(const KernelRunArgs& a) {
  const TensorView& y = a.outputs[0];
  const int64_t mel_bins = ReadInt(a.inputs[0], 0), dft_length = ReadInt(a.inputs[1], 0),
                sample_rate = ReadInt(a.inputs[2], 0);
  const double lower = ReadScalar(a.inputs[3]), upper = ReadScalar(a.inputs[4]);
  const int64_t spectrogram_bins = dft_length / 2 + 1;
  if (y.dims.size() != 2 || y.dims[0] != spectrogram_bins || y.dims[1] != mel_bins ||
      sample_rate < 1) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "MelWeightMatrix of {} mel bins, DFT length {} and sample rate {} into an "
                     "output of [{}]",
                     mel_bins, dft_length, sample_rate, fmt::join(y.dims, "x"));
  }
  auto to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double low_mel = to_mel(lower), high_mel = to_mel(upper);
  const double step = (high_mel - low_mel) / static_cast<double>(mel_bins + 2);
  std::vector<int64_t> points(static_cast<size_t>(mel_bins + 2));
  for (int64_t i = 0; i < mel_bins + 2; ++i) {
    const double hz =
        700.0 * (std::pow(10.0, (static_cast<double>(i) * step + low_mel) / 2595.0) - 1.0);
    const double bin =
        std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate));
    if (!std::isfinite(bin) || std::fabs(bin) > 1e15) {
      return MakeError(ErrorCode::kKernelFailed,
                       "MelWeightMatrix edges {} and {} Hz give DFT bin {}; the edges must be "
                       "finite and above -700 Hz",
                       lower, upper, bin);
    }
    points[static_cast<size_t>(i)] = static_cast<int64_t>(bin);
  }
  std::vector<double> w(static_cast<size_t>(spectrogram_bins * mel_bins), 0.0);
  auto at = [&](int64_t j, int64_t i) -> double* {
    if (j < 0 || j >= spectrogram_bins) return nullptr;  // an edge past the Nyquist bin
    return &w[static_cast<size_t>(j * mel_bins + i)];
  };
  for (int64_t i = 0; i < mel_bins; ++i) {
    const int64_t lo = points[static_cast<size_t>(i)], center = points[static_cast<size_t>(i + 1)],
                  hi = points[static_cast<size_t>(i + 2)];
    if (center == lo) {
      if (double* p = at(center, i)) *p = 1;
    } else {
      for (int64_t j = std::max<int64_t>(lo, 0); j <= std::min(center, spectrogram_bins - 1); ++j) {
        if (double* p = at(j, i))
          *p = static_cast<double>(j - lo) / static_cast<double>(center - lo);
      }
    }
    for (int64_t j = std::max<int64_t>(center, 0); j < std::min(hi, spectrogram_bins); ++j) {
      if (double* p = at(j, i)) *p = static_cast<double>(hi - j) / static_cast<double>(hi - center);
    }
  }
  return DispatchNumeric(y.dtype, [&](auto tag) -> Status {
    using T = typename decltype(tag)::type;
    T* out = y.as<T>();
    for (size_t k = 0; k < w.size(); ++k) out[k] = static_cast<T>(w[k]);
    return OkStatus();
  });
}

bool OptionalIndex(const KernelRequest& r, size_t i) {
  return InType(r, i) == DataType::kUndefined || IsIndexType(InType(r, i));
}

bool NumericOutput(const KernelRequest& r) {
  const DataType t = OutType(r, 0);
  return t == DataType::kFloat32 || t == DataType::kFloat64 || IsInteger(t);
}

void RegisterWindow(const char* op, Window kind) {
  RegisterOpKernel({
      .op_type = op,
      .name_operand = -1,
      .accepts =
          [](const KernelRequest& r) { return IsIndexType(InType(r, 0)) && NumericOutput(r); },
      .create =
          [kind](const KernelRequest& r) {
            const bool periodic = r.node->attrs().GetInt("periodic", 1) != 0;
            return KernelOr(
                [kind, periodic](const KernelRunArgs& a) { return RunWindow(kind, periodic, a); });
          },
  });
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "DFT",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && OptionalIndex(r, 1) && OptionalIndex(r, 2);
          },
      .create =
          [](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            DftSpec spec{attrs::DFT::inverse(at) != 0, attrs::DFT::onesided(at) != 0};
            return KernelOr([spec](const KernelRunArgs& a) { return RunDft(spec, a); });
          },
  });
  RegisterOpKernel({
      .op_type = "STFT",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && IsIndexType(InType(r, 1)) &&
                   (InType(r, 2) == DataType::kUndefined || InType(r, 2) == DataType::kFloat32) &&
                   OptionalIndex(r, 3);
          },
      .create = [](const KernelRequest&) { return KernelOr(RunStft); },
  });
  RegisterWindow("HannWindow", Window::kHann);
  RegisterWindow("HammingWindow", Window::kHamming);
  RegisterWindow("BlackmanWindow", Window::kBlackman);
  RegisterOpKernel({
      .op_type = "MelWeightMatrix",
      .name_operand = -1,
      .accepts =
          [](const KernelRequest& r) {
            return IsIndexType(InType(r, 0)) && IsIndexType(InType(r, 1)) &&
                   IsIndexType(InType(r, 2)) && NumericOutput(r);
          },
      .create = [](const KernelRequest&) { return KernelOr(RunMelWeightMatrix); },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
