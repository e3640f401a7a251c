// Tensor storage and element conversion.
#include "kiln/ir/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kiln/core/minifloat.h"
#include "kiln/ir/sizes.h"

namespace kiln {

int64_t NumElements(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n = SatMul(n, d);
  return n;
}

size_t ByteSize(int64_t elements, DataType dtype) {
  return static_cast<size_t>(
      SatMul(std::max<int64_t>(elements, 0), static_cast<int64_t>(SizeOf(dtype))));
}

namespace {
// zero = false only where every byte is written next (a copy).
std::shared_ptr<void> AllocateAligned(size_t bytes, bool zero = true) {
  // Callers pass checked sizes (ir/sizes.h); one that is not fails here, never under-allocates.
  if (bytes > static_cast<size_t>(kMaxTensorBytes)) throw std::bad_alloc();
  size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  if (zero) {
    std::memset(p, 0, rounded);
  } else if (rounded > bytes) {
    std::memset(static_cast<char*>(p) + bytes, 0, rounded - bytes);  // the tail padding
  }
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
}  // namespace

Tensor::Tensor(DataType dtype, std::vector<int64_t> dims) : dtype_(dtype), dims_(std::move(dims)) {
  auto storage = AllocateAligned(size_bytes());
  data_ = storage.get();
  storage_ = std::move(storage);
}

Tensor Tensor::FromBytes(DataType dtype, std::vector<int64_t> dims,
                         std::span<const std::byte> bytes) {
  Tensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  const size_t size = t.size_bytes();
  const size_t n = std::min(bytes.size(), size);
  // Only the bytes the copy does not cover are zeroed (a short `bytes` leaves zeros).
  auto storage = AllocateAligned(size, /*zero=*/n < size);
  if (n) std::memcpy(storage.get(), bytes.data(), n);
  t.data_ = storage.get();
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::Borrow(DataType dtype, std::vector<int64_t> dims, const void* data,
                      std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.data_ = data;
  t.storage_ = std::move(keepalive);
  return t;
}

void* Tensor::mutable_raw() {
  // Copy-on-write: a shared or borrowed buffer is never modified in place.
  if (storage_.use_count() != 1 || storage_.get() != data_) {
    auto fresh = AllocateAligned(size_bytes(), /*zero=*/false);
    std::memcpy(fresh.get(), data_, size_bytes());
    data_ = fresh.get();
    storage_ = std::move(fresh);
  }
  return const_cast<void*>(data_);
}

double LoadAsDouble(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DataType::kFloat32:
      return static_cast<const float*>(v.data)[i];
    case DataType::kFloat16:
      return HalfBitsToFloat(static_cast<const uint16_t*>(v.data)[i]);
    case DataType::kBFloat16:
      return BFloat16BitsToFloat(static_cast<const uint16_t*>(v.data)[i]);
    case DataType::kInt8:
      return static_cast<const int8_t*>(v.data)[i];
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(v.data)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(v.data)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(v.data)[i]);
    case DataType::kBool:
      return static_cast<const uint8_t*>(v.data)[i] ? 1.0 : 0.0;
    case DataType::kFloat64:
      return static_cast<const double*>(v.data)[i];
    case DataType::kInt16:
      return static_cast<const int16_t*>(v.data)[i];
    case DataType::kUInt16:
      return static_cast<const uint16_t*>(v.data)[i];
    case DataType::kUInt32:
      return static_cast<const uint32_t*>(v.data)[i];
    case DataType::kUInt64:
      return static_cast<double>(static_cast<const uint64_t*>(v.data)[i]);
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:
      return Float8BitsToFloat(static_cast<const uint8_t*>(v.data)[i], ToFloat8Format(v.dtype));
    case DataType::kFloat8E8M0:
      return E8M0BitsToFloat(static_cast<const uint8_t*>(v.data)[i]);
    case DataType::kFloat4E2M1:
      return Float4E2M1BitsToFloat(static_cast<const uint8_t*>(v.data)[i]);
    case DataType::kInt4:
    case DataType::kInt2:
      return static_cast<const int8_t*>(v.data)[i];
    case DataType::kUInt4:
    case DataType::kUInt2:
      return static_cast<const uint8_t*>(v.data)[i];
    case DataType::kUndefined:
      break;
  }
  return 0;
}

void StoreFromDouble(const TensorView& v, int64_t i, double x) {
  switch (v.dtype) {
    case DataType::kFloat32:
      static_cast<float*>(v.data)[i] = static_cast<float>(x);
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(v.data)[i] = FloatToHalfBits(static_cast<float>(x));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(v.data)[i] = FloatToBFloat16Bits(static_cast<float>(x));
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(v.data)[i] = static_cast<int8_t>(x);
      break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(v.data)[i] = static_cast<uint8_t>(x);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(v.data)[i] = static_cast<int32_t>(x);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(v.data)[i] = static_cast<int64_t>(x);
      break;
    case DataType::kBool:
      static_cast<uint8_t*>(v.data)[i] = x != 0 ? 1 : 0;
      break;
    case DataType::kFloat64:
      static_cast<double*>(v.data)[i] = x;
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(v.data)[i] = static_cast<int16_t>(x);
      break;
    case DataType::kUInt16:
      static_cast<uint16_t*>(v.data)[i] = static_cast<uint16_t>(x);
      break;
    case DataType::kUInt32:
      static_cast<uint32_t*>(v.data)[i] = static_cast<uint32_t>(x);
      break;
    case DataType::kUInt64:
      static_cast<uint64_t*>(v.data)[i] = static_cast<uint64_t>(x);
      break;
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:
      static_cast<uint8_t*>(v.data)[i] =
          FloatToFloat8Bits(static_cast<float>(x), ToFloat8Format(v.dtype), /*saturate=*/true);
      break;
    case DataType::kFloat8E8M0:
      static_cast<uint8_t*>(v.data)[i] =
          FloatToE8M0Bits(static_cast<float>(x), /*saturate=*/true, E8M0Rounding::kUp);
      break;
    case DataType::kFloat4E2M1:
      static_cast<uint8_t*>(v.data)[i] = FloatToFloat4E2M1Bits(static_cast<float>(x));
      break;
    case DataType::kInt4:
    case DataType::kUInt4:
    case DataType::kInt2:
    case DataType::kUInt2:
      // Like Cast: truncation toward zero, then the higher bits dropped.
      static_cast<uint8_t*>(v.data)[i] = static_cast<uint8_t>(
          WrapToBits(std::isfinite(x) && std::fabs(x) < 9.2e18 ? static_cast<int64_t>(x) : 0,
                     BitWidth(v.dtype), v.dtype == DataType::kInt4 || v.dtype == DataType::kInt2));
      break;
    case DataType::kUndefined:
      break;
  }
}

double Tensor::GetDouble(int64_t i) const { return LoadAsDouble(view(), i); }

int64_t Tensor::GetInt(int64_t i) const {
  if (dtype_ == DataType::kInt64) return data<int64_t>()[i];
  return static_cast<int64_t>(GetDouble(i));
}

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// FP32 -> FP16 with the CPU's F16C conversion (round to nearest even, as FloatToHalfBits), eight
// at a time; a group holding a NaN goes through FloatToHalfBits, which encodes NaNs its own way.
__attribute__((target("avx,f16c"))) void FloatsToHalfF16c(const float* f, uint16_t* h, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(f + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) h[j] = FloatToHalfBits(f[j]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) h[i] = FloatToHalfBits(f[i]);
}

bool HasF16c() {
  // CPUID leaf 1, ECX bit 29 (clang has no "f16c" for __builtin_cpu_supports); "avx" also
  // checks that the OS saves the YMM registers.
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0 &&
           __builtin_cpu_supports("avx");
  }();
  return has;
}
#endif

void FloatsToHalf(const float* f, uint16_t* h, int64_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (HasF16c()) return FloatsToHalfF16c(f, h, n);
#endif
  for (int64_t i = 0; i < n; ++i) h[i] = FloatToHalfBits(f[i]);
}

}  // namespace

Tensor Tensor::ForOverwrite(DataType dtype, std::vector<int64_t> dims) {
  Tensor out;
  out.dtype_ = dtype;
  out.dims_ = std::move(dims);
  auto storage = AllocateAligned(out.size_bytes(), /*zero=*/false);
  out.data_ = storage.get();
  out.storage_ = std::move(storage);
  return out;
}

Tensor Tensor::CastTo(DataType dtype) const {
  // Every element is written below, so the storage is not zeroed first (a refit casts every
  // weight of an FP16 engine: the zero-fill was a tenth of its replay).
  Tensor out = ForOverwrite(dtype, dims_);
  CastElements(view(), out.view(), 0, num_elements());
  return out;
}

void CastElements(const TensorView& src, const TensorView& dst, int64_t begin, int64_t end) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  if (src.dtype == dst.dtype) {
    // The same type: the same bytes (Conv+BN folding casts every f32 weight to f32; element by
    // element through double that was most of ResNet-50's graph passes).
    const size_t size = SizeOf(src.dtype);
    std::memcpy(static_cast<std::byte*>(dst.data) + begin * size,
                static_cast<const std::byte*>(src.data) + begin * size, n * size);
    return;
  }
  // The precision phase's conversions (every weight of an FP16 build, once to ask the kernels
  // and once to rewrite) as typed loops: through double and a switch per element they were most
  // of a warm ResNet-50 build's second.
  const auto typed = [&]<typename From, typename To>(auto convert) {
    const From* f = static_cast<const From*>(src.data) + begin;
    To* t = static_cast<To*>(dst.data) + begin;
    for (int64_t i = 0; i < n; ++i) t[i] = convert(f[i]);
  };
  if (src.dtype == DataType::kFloat32 && dst.dtype == DataType::kFloat16) {
    FloatsToHalf(static_cast<const float*>(src.data) + begin,
                 static_cast<uint16_t*>(dst.data) + begin, n);
    return;
  }
  if (src.dtype == DataType::kFloat32 && dst.dtype == DataType::kBFloat16) {
    typed.operator()<float, uint16_t>([](float x) { return FloatToBFloat16Bits(x); });
    return;
  }
  if (src.dtype == DataType::kFloat16 && dst.dtype == DataType::kFloat32) {
    typed.operator()<uint16_t, float>([](uint16_t h) { return HalfBitsToFloat(h); });
    return;
  }
  if (src.dtype == DataType::kBFloat16 && dst.dtype == DataType::kFloat32) {
    typed.operator()<uint16_t, float>([](uint16_t h) { return BFloat16BitsToFloat(h); });
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    double x = LoadAsDouble(src, i);
    if (IsInteger(dst.dtype) && std::isfinite(x)) x = std::trunc(x);
    StoreFromDouble(dst, i, x);
  }
}

std::vector<int64_t> Tensor::ToInt64Vector() const {
  std::vector<int64_t> out(static_cast<size_t>(num_elements()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = GetInt(static_cast<int64_t>(i));
  return out;
}

std::vector<float> Tensor::ToFloatVector() const {
  std::vector<float> out(static_cast<size_t>(num_elements()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<float>(GetDouble(static_cast<int64_t>(i)));
  return out;
}

}  // namespace kiln
