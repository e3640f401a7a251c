// A vector with inline storage for the CPU kernels' per-run bookkeeping (dims, strides,
// coordinates, axes, per-input offsets): Run must not allocate (kernel.h), and these are
// bounded by the tensor rank or the input count, so they live on the stack. Past N elements it
// moves to the heap, which only tensors of rank > N (or ops with > N inputs) would reach.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <vector>

namespace kiln::cpu {

template <typename T, size_t N = 12>
class SmallVec {
 public:
  SmallVec() = default;
  explicit SmallVec(size_t n, const T& v = T()) { assign(n, v); }
  SmallVec(std::initializer_list<T> values) { append(values.begin(), values.end()); }
  template <typename It>
  SmallVec(It begin, It end) {
    append(begin, end);
  }
  SmallVec(std::span<const T> s) { append(s.begin(), s.end()); }  // NOLINT: implicit on purpose

  void assign(size_t n, const T& v) {
    clear();
    for (size_t i = 0; i < n; ++i) push_back(v);
  }
  template <typename It>
  void append(It begin, It end) {
    for (; begin != end; ++begin) push_back(*begin);
  }
  void push_back(const T& v) {
    if (heap_.empty() && size_ < N) {
      inline_[size_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + size_);
    heap_.push_back(v);
    ++size_;
  }
  void resize(size_t n, const T& v = T()) {
    while (size_ > n) pop_back();
    while (size_ < n) push_back(v);
  }
  void pop_back() {
    if (!heap_.empty()) heap_.pop_back();
    --size_;
  }
  void clear() {
    heap_.clear();
    size_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return heap_.empty() ? inline_.data() : heap_.data(); }
  const T* data() const { return heap_.empty() ? inline_.data() : heap_.data(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  operator std::span<const T>() const { return {data(), size_}; }  // NOLINT
  bool operator==(const SmallVec& o) const {
    return std::equal(begin(), end(), o.begin(), o.end());
  }

 private:
  std::array<T, N> inline_{};
  std::vector<T> heap_;  // all elements, once more than N
  size_t size_ = 0;
};

// Dims, strides, coordinates or axes of one tensor.
using DimVec = SmallVec<int64_t, 12>;

}  // namespace kiln::cpu
