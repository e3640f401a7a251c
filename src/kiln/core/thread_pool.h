// A fixed pool of worker threads for data-parallel kernels and the builder's timing work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // threads == 0: one per hardware thread (or KILN_NUM_THREADS). spin_us < 0: how long a waiting
  // thread spins before it sleeps comes from KILN_THREAD_SPIN_US.
  explicit ThreadPool(int threads = 0, int64_t spin_us = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) split into at most size() contiguous chunks; the calling
  // thread takes one chunk. Returns when all chunks are done. Calls from inside fn run inline.
  // Takes any callable by reference (no std::function, so no allocation on the hot path).
  template <typename F>
  void ParallelFor(int64_t n, F&& fn, int64_t min_chunk = 1) {
    using Fn = std::remove_reference_t<F>;
    Run(n,
        ChunkFn{const_cast<void*>(static_cast<const void*>(&fn)),
                [](void* f, int64_t b, int64_t e) { (*static_cast<Fn*>(f))(b, e); }},
        min_chunk);
  }

  // The process-wide pool.
  static ThreadPool& Default();

 private:
  // A non-owning reference to the caller's callable.
  struct ChunkFn {
    void* object;
    void (*call)(void*, int64_t, int64_t);
    void operator()(int64_t b, int64_t e) const { call(object, b, e); }
  };
  void Run(int64_t n, ChunkFn fn, int64_t min_chunk);
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  // Hand-off: Run writes the job, then publishes it by bumping generation_ (under mu_, so a
  // worker about to sleep cannot miss it). Workers and the caller spin up to spin_ns_ on the
  // atomics before they block on the condition variables: on a virtual machine whose idle vCPUs
  // halt, a futex wake-up costs tens of microseconds, more than most layers' parallel work.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  ChunkFn job_{nullptr, nullptr};
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  int64_t spin_ns_ = 0;
  std::mutex run_mu_;  // one ParallelFor at a time
};

}  // namespace kiln
