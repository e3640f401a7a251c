// A fixed pool of worker threads for data-parallel kernels and the builder's timing work.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // threads == 0: one per hardware thread (or KILN_NUM_THREADS).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) split into at most size() contiguous chunks; the calling
  // thread takes one chunk. Returns when all chunks are done. Calls from inside fn run inline.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_chunk = 1);

  // The process-wide pool.
  static ThreadPool& Default();

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::mutex run_mu_;  // one ParallelFor at a time
};

}  // namespace kiln
