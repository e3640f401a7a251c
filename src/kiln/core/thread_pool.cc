// ThreadPool: generation-counted job hand-off; chunk i of a job goes to worker i-1. Waits spin
// briefly on atomics, then block on condition variables (spin-then-block, as OpenMP runtimes do).
#include "kiln/core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kiln/core/params.h"

namespace kiln {

namespace {
thread_local bool t_in_pool_job = false;

std::pair<int64_t, int64_t> ChunkRange(int64_t n, int chunks, int i) {
  int64_t base = n / chunks, extra = n % chunks;
  int64_t begin = i * base + std::min<int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until done() or until spin_ns have passed; true if done() became true.
template <typename Done>
bool SpinUntil(int64_t spin_ns, Done&& done) {
  if (spin_ns <= 0) return done();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::yield();  // an oversubscribed machine gets the core back
  }
}
}  // namespace

ThreadPool::ThreadPool(int threads, int64_t spin_us) {
  if (threads <= 0) threads = static_cast<int>(param::NumThreads());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (spin_us < 0) spin_us = param::ThreadSpinUs();
  spin_ns_ = std::max<int64_t>(0, spin_us) * 1000;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool pool;
  return pool;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!SpinUntil(spin_ns_, ready)) {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // The job fields were written before generation_ was bumped (release), and Run does not
    // touch them again until every worker has acknowledged this generation through pending_
    // (workers without a chunk too), so no newer generation can be published meanwhile.
    seen = generation_.load(std::memory_order_acquire);
    if (index < job_chunks_) {
      ChunkFn job = job_;
      auto [b, e] = ChunkRange(job_n_, job_chunks_, index);
      t_in_pool_job = true;
      job(b, e);
      t_in_pool_job = false;
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mu_);  // the caller may be between its check and its wait
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::Run(int64_t n, ChunkFn fn, int64_t min_chunk) {
  if (n <= 0) return;
  int chunks = static_cast<int>(
      std::min<int64_t>(size(), (n + min_chunk - 1) / std::max<int64_t>(1, min_chunk)));
  if (chunks <= 1 || t_in_pool_job) {
    fn(0, n);
    return;
  }
  std::lock_guard run_lock(run_mu_);
  job_ = fn;
  job_n_ = n;
  job_chunks_ = chunks;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  auto [b, e] = ChunkRange(n, chunks, 0);
  t_in_pool_job = true;
  fn(b, e);
  t_in_pool_job = false;
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(spin_ns_, done)) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, done);
  }
}

}  // namespace kiln
