// ThreadPool: generation-counted job hand-off; chunk i of a job goes to worker i-1.
#include "kiln/core/thread_pool.h"

#include <algorithm>

#include "kiln/core/params.h"

namespace kiln {

namespace {
thread_local bool t_in_pool_job = false;

std::pair<int64_t, int64_t> ChunkRange(int64_t n, int chunks, int i) {
  int64_t base = n / chunks, extra = n % chunks;
  int64_t begin = i * base + std::min<int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(param::NumThreads());
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
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
    std::unique_lock lock(mu_);
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= job_chunks_) continue;
    ChunkFn job = job_;
    auto [b, e] = ChunkRange(job_n_, job_chunks_, index);
    lock.unlock();
    t_in_pool_job = true;
    job(b, e);
    t_in_pool_job = false;
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
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
  {
    std::lock_guard lock(mu_);
    job_ = fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  auto [b, e] = ChunkRange(n, chunks, 0);
  t_in_pool_job = true;
  fn(b, e);
  t_in_pool_job = false;
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = {nullptr, nullptr};
}

}  // namespace kiln
