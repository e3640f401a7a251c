// Sampler: export of GPU samples as kiln_gpu_* metrics, detector events as logs and counters.
#include "kiln/obs/sampler.h"

#include "kiln/core/logging.h"

namespace kiln::obs {

namespace {
using prometheus::Counter;
using prometheus::Gauge;
}  // namespace

// Metric handles of one GPU, created on first use so that a value the GPU never reports (remapped
// rows on a consumer card) never appears as a misleading 0.
struct Sampler::DeviceMetrics {
  std::string gpu;
  Gauge* memory_used = nullptr;
  Gauge* memory_total = nullptr;
  Gauge* util = nullptr;
  Gauge* mem_util = nullptr;
  Gauge* temperature = nullptr;
  Gauge* power = nullptr;
  std::map<uint64_t, Gauge*> clock_reason;
  Counter* ecc_corrected = nullptr;
  Counter* ecc_uncorrected = nullptr;
  std::optional<uint64_t> last_ecc_corrected, last_ecc_uncorrected;
  Gauge* remapped_correctable = nullptr;
  Gauge* remapped_uncorrectable = nullptr;
  Gauge* remap_pending = nullptr;
  Gauge* remap_failed = nullptr;
  std::map<HealthKind, Gauge*> condition;
  std::map<HealthKind, Counter*> events;
};

Sampler::Sampler(GpuSource* source, KilnMetrics* metrics, SamplerOptions options)
    : source_(source), metrics_(metrics), options_(options), detectors_(options.detectors) {
  metrics_->GaugeFamily("kiln_nvml_up", "1 when a GPU source (NVML) is loaded and sampled")
      .Add({})
      .Set(source_ != nullptr ? 1 : 0);
  metrics_->GaugeFamily("kiln_gpu_devices", "GPUs the GPU source reports")
      .Add({})
      .Set(source_ != nullptr ? source_->DeviceCount() : 0);
  nvml_errors_ = &metrics_->CounterFamily("kiln_nvml_errors_total",
                                          "Failed GPU source (NVML) calls while sampling, by call");
  samples_total_ =
      &metrics_
           ->CounterFamily("kiln_gpu_samples_total", "GPU samples taken (one per device per poll)")
           .Add({});
  round_seconds_ = &metrics_
                        ->HistogramFamily("kiln_gpu_sample_duration_seconds",
                                          "Time to poll every GPU once, in seconds")
                        .Add({}, prometheus::Histogram::BucketBoundaries{
                                     1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1});
  if (source_ != nullptr) {
    auto& info = metrics_->GaugeFamily("kiln_gpu_info", "GPU identity (value always 1)");
    for (int d = 0; d < source_->DeviceCount(); ++d) {
      auto gi = source_->Info(d);
      if (!gi.ok()) continue;
      info.Add({{"gpu", std::to_string(d)},
                {"name", gi->name},
                {"uuid", gi->uuid},
                {"pci_bus_id", gi->pci_bus_id}})
          .Set(1);
    }
  }
}

Sampler::~Sampler() { Stop(); }

Status Sampler::Start() {
  if (poll_thread_.joinable()) {
    return MakeError(ErrorCode::kInvalidArgument, "the GPU sampler is already running");
  }
  if (options_.interval.count() <= 0 || options_.xid_wait.count() <= 0) {
    return MakeError(ErrorCode::kOutOfRange,
                     "sampling interval ({} ms) and Xid wait ({} ms) must be positive",
                     options_.interval.count(), options_.xid_wait.count());
  }
  KILN_RETURN_IF_ERROR(Validate(options_.detectors));
  if (source_ == nullptr) return OkStatus();
  {
    std::lock_guard lock(stop_mu_);
    stop_ = false;
  }
  poll_thread_ = std::thread([this] {
    std::unique_lock lock(stop_mu_);
    while (!stop_) {
      lock.unlock();
      SampleOnce(Clock::now());
      lock.lock();
      stop_cv_.wait_for(lock, options_.interval, [&] { return stop_; });
    }
  });
  xid_thread_ = std::thread([this] {
    for (;;) {
      {
        std::lock_guard lock(stop_mu_);
        if (stop_) return;
      }
      if (!PollXidOnce(options_.xid_wait)) return;
    }
  });
  return OkStatus();
}

void Sampler::Stop() {
  {
    std::lock_guard lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (poll_thread_.joinable()) poll_thread_.join();
  if (xid_thread_.joinable()) xid_thread_.join();
}

Sampler::DeviceMetrics& Sampler::ForDevice(int device) {
  auto& slot = devices_[device];
  if (!slot) {
    slot = std::make_unique<DeviceMetrics>();
    slot->gpu = std::to_string(device);
  }
  return *slot;
}

void Sampler::CountCallError(int device, const CallError& error) {
  call_failures_.fetch_add(1, std::memory_order_relaxed);
  nvml_errors_->Add({{"call", error.call}}).Increment();
  // One warning when a call starts failing on a device, not one per poll.
  if (failing_calls_.insert({device, error.call}).second) {
    LogEvent e{std::chrono::system_clock::now(),
               LogLevel::kWarn,
               Subsystem::kOBS,
               fmt::format("GPU {}: {} failed: {} (NVML error {}); sampling continues", device,
                           error.call, error.message, error.code),
               {{"event", "nvml_call_failed"},
                {"code", LookupError(ErrorCode::kNvmlCallFailed).Id()},
                {"gpu", std::to_string(device)},
                {"call", error.call}}};
    if (LogEnabled(e.level, e.subsystem)) Log(std::move(e));
  }
}

void Sampler::Export(const GpuSample& s) {
  DeviceMetrics& m = ForDevice(s.device);
  const prometheus::Labels gpu{{"gpu", m.gpu}};
  auto gauge = [&](Gauge*& slot, const char* name, const char* help, double value) {
    if (!slot) slot = &metrics_->GaugeFamily(name, help).Add(gpu);
    slot->Set(value);
  };
  if (s.memory_used_bytes) {
    gauge(m.memory_used, "kiln_gpu_memory_used_bytes", "GPU memory in use, in bytes",
          static_cast<double>(*s.memory_used_bytes));
  }
  if (s.memory_total_bytes) {
    gauge(m.memory_total, "kiln_gpu_memory_total_bytes", "GPU memory in total, in bytes",
          static_cast<double>(*s.memory_total_bytes));
  }
  if (s.utilization_gpu_ratio) {
    gauge(m.util, "kiln_gpu_utilization_ratio",
          "Share of the last sample period in which a kernel ran (0..1)", *s.utilization_gpu_ratio);
  }
  if (s.utilization_memory_ratio) {
    gauge(m.mem_util, "kiln_gpu_memory_utilization_ratio",
          "Share of the last sample period in which device memory was read or written (0..1)",
          *s.utilization_memory_ratio);
  }
  if (s.temperature_celsius) {
    gauge(m.temperature, "kiln_gpu_temperature_celsius", "GPU die temperature, in degrees Celsius",
          *s.temperature_celsius);
  }
  if (s.power_watts) {
    gauge(m.power, "kiln_gpu_power_watts", "GPU power draw, in watts", *s.power_watts);
  }
  if (s.clock_event_reasons) {
    auto& family = metrics_->GaugeFamily(
        "kiln_gpu_clock_event_active",
        "1 while a clock-event (throttle) reason holds the GPU's clocks down, by reason");
    for (const auto& r : clock_event::kReasons) {
      Gauge*& g = m.clock_reason[r.bit];
      if (!g) g = &family.Add({{"gpu", m.gpu}, {"reason", r.label}});
      g->Set((*s.clock_event_reasons & r.bit) ? 1 : 0);
    }
  }
  // NVML's aggregate ECC counts are lifetime counters; the metric counts from kiln's first
  // sample on (increments only, so a counter reset by the driver is never negative).
  auto ecc = [&](Counter*& slot, std::optional<uint64_t>& last, const char* type, uint64_t now) {
    if (!slot) {
      slot = &metrics_
                  ->CounterFamily("kiln_gpu_ecc_errors_total",
                                  "ECC errors seen since kiln started sampling, by type")
                  .Add({{"gpu", m.gpu}, {"type", type}});
    }
    if (last && now > *last) slot->Increment(static_cast<double>(now - *last));
    last = now;
  };
  if (s.ecc_corrected_total)
    ecc(m.ecc_corrected, m.last_ecc_corrected, "corrected", *s.ecc_corrected_total);
  if (s.ecc_uncorrected_total) {
    ecc(m.ecc_uncorrected, m.last_ecc_uncorrected, "uncorrected", *s.ecc_uncorrected_total);
  }
  if (s.remapped_rows_correctable) {
    auto& family =
        metrics_->GaugeFamily("kiln_gpu_remapped_rows", "Rows remapped in GPU memory, by cause");
    if (!m.remapped_correctable) {
      m.remapped_correctable = &family.Add({{"gpu", m.gpu}, {"cause", "correctable"}});
      m.remapped_uncorrectable = &family.Add({{"gpu", m.gpu}, {"cause", "uncorrectable"}});
    }
    m.remapped_correctable->Set(*s.remapped_rows_correctable);
    m.remapped_uncorrectable->Set(s.remapped_rows_uncorrectable.value_or(0));
  }
  if (s.remap_pending) {
    gauge(m.remap_pending, "kiln_gpu_remap_pending",
          "1 when a row remap is pending (takes effect at the next GPU reset)", *s.remap_pending);
  }
  if (s.remap_failed) {
    gauge(m.remap_failed, "kiln_gpu_remap_failed", "1 when a row remap has failed (drain the node)",
          *s.remap_failed);
  }
}

void Sampler::SampleOnce(Clock::time_point now) {
  if (source_ == nullptr) return;
  auto start = Clock::now();
  std::vector<HealthEvent> events;
  {
    std::lock_guard lock(mu_);
    for (int d = 0; d < source_->DeviceCount(); ++d) {
      StatusOr<GpuSample> sample = source_->Sample(d);
      if (!sample.ok()) {
        sample_failures_.fetch_add(1, std::memory_order_relaxed);
        nvml_errors_->Add({{"call", "sample"}}).Increment();
        if (failing_devices_.insert(d).second) {
          LogEvent e{std::chrono::system_clock::now(),
                     LogLevel::kWarn,
                     Subsystem::kOBS,
                     fmt::format("GPU {} could not be sampled: {}; sampling continues", d,
                                 sample.status().ToString()),
                     {{"event", "gpu_sample_failed"},
                      {"code", sample.status().Id()},
                      {"gpu", std::to_string(d)}}};
          if (LogEnabled(e.level, e.subsystem)) Log(std::move(e));
        }
        continue;
      }
      if (failing_devices_.erase(d) > 0) {
        KILN_LOG(Info, OBS, "GPU {} is sampled again", d);
      }
      samples_.fetch_add(1, std::memory_order_relaxed);
      samples_total_->Increment();
      for (const CallError& err : sample->errors) CountCallError(d, err);
      // Calls that succeeded again end their failure streak.
      for (auto it = failing_calls_.begin(); it != failing_calls_.end();) {
        bool still = false;
        for (const CallError& err : sample->errors) still |= (err.call == it->second);
        it = (it->first == d && !still) ? failing_calls_.erase(it) : std::next(it);
      }
      Export(*sample);
      for (HealthEvent& e : detectors_.Observe(*sample, now)) events.push_back(std::move(e));
    }
    for (const HealthEvent& e : events) Handle(e);
  }
  rounds_.fetch_add(1, std::memory_order_relaxed);
  round_seconds_->Observe(std::chrono::duration<double>(Clock::now() - start).count());
  if (callback_) {
    for (const HealthEvent& e : events) callback_(e);
  }
}

bool Sampler::PollXidOnce(std::chrono::milliseconds timeout) {
  if (source_ == nullptr) return false;
  StatusOr<std::vector<XidEvent>> xids = source_->WaitXid(timeout);
  if (!xids.ok()) {
    if (xids.status().code() == ErrorCode::kNvmlNotSupported) {
      KILN_LOG(Info, OBS, "Xid events are not available: {}", xids.status().message());
      return false;
    }
    call_failures_.fetch_add(1, std::memory_order_relaxed);
    nvml_errors_->Add({{"call", "nvmlEventSetWait_v2"}}).Increment();
    return true;
  }
  std::vector<HealthEvent> events;
  {
    std::lock_guard lock(mu_);
    for (const XidEvent& x : *xids) {
      xid_events_.fetch_add(1, std::memory_order_relaxed);
      metrics_
          ->CounterFamily("kiln_gpu_xid_events_total", "Xid errors reported by the driver, by Xid")
          .Add({{"gpu", std::to_string(x.device)}, {"xid", std::to_string(x.xid)}})
          .Increment();
      events.push_back(detectors_.OnXid(x));
      Handle(events.back());
    }
  }
  if (callback_) {
    for (const HealthEvent& e : events) callback_(e);
  }
  return true;
}

void Sampler::Handle(const HealthEvent& e) {
  DeviceMetrics& m = ForDevice(e.device);
  std::string kind(ToString(e.kind));
  if (e.kind != HealthKind::kXid) {
    Gauge*& g = m.condition[e.kind];
    if (!g) {
      g = &metrics_
               ->GaugeFamily("kiln_gpu_health_condition",
                             "1 while a health detector's condition holds on a GPU, by kind")
               .Add({{"gpu", m.gpu}, {"kind", kind}});
    }
    g->Set(e.active ? 1 : 0);
  }
  if (e.active) {
    health_events_.fetch_add(1, std::memory_order_relaxed);
    Counter*& c = m.events[e.kind];
    if (!c) {
      c = &metrics_
               ->CounterFamily("kiln_gpu_health_events_total",
                               "Health conditions raised by kiln's detectors, by kind")
               .Add({{"gpu", m.gpu}, {"kind", kind}});
    }
    c->Increment();
  }
  LogEvent ev{std::chrono::system_clock::now(),
              e.active ? LogLevel::kWarn : LogLevel::kInfo,
              Subsystem::kOBS,
              e.detail,
              {{"event", "gpu_health"},
               {"kind", kind},
               {"state", e.active ? "raised" : "cleared"},
               {"gpu", m.gpu}}};
  // Only a raised condition carries its catalog code (and so counts in kiln_errors_total).
  if (e.active) ev.fields.emplace_back("code", LookupError(CodeOf(e.kind)).Id());
  if (e.kind == HealthKind::kXid) ev.fields.emplace_back("xid", std::to_string(e.xid));
  if (LogEnabled(ev.level, ev.subsystem)) Log(std::move(ev));
}

SamplerStats Sampler::stats() const {
  return SamplerStats{rounds_.load(),        samples_.load(),    sample_failures_.load(),
                      call_failures_.load(), xid_events_.load(), health_events_.load()};
}

}  // namespace kiln::obs
