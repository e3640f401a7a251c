// Progress output with an injected clock: plain lines, bar redraw rate, events, ETA math.
#include "kiln/obs/progress.h"

#include <gtest/gtest.h>

#include "tests/obs/metrics_text.h"

namespace kiln::obs {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = Progress::Clock;

struct Harness {
  Clock::time_point now{};
  std::vector<std::string> writes;
  std::vector<LogEvent> events;
  LogSink old_sink;
  KilnMetrics metrics;

  Harness() {
    old_sink = SetLogSink([this](const LogEvent& e) { events.push_back(e); });
  }
  ~Harness() { SetLogSink(old_sink); }

  ProgressOptions Options(ProgressMode mode, int64_t total) {
    ProgressOptions o;
    o.phase = "tactics";
    o.total = total;
    o.unit = "layers";
    o.mode = mode;
    o.clock = [this] { return now; };
    o.write = [this](std::string_view s) { writes.emplace_back(s); };
    o.metrics = &metrics;
    return o;
  }
  std::string Field(const LogEvent& e, const std::string& key) {
    for (const auto& [k, v] : e.fields) {
      if (k == key) return v;
    }
    return "";
  }
};

TEST(Progress, EtaFromTheAverageRate) {
  Harness h;
  Progress p(h.Options(ProgressMode::kSilent, 100));
  EXPECT_FALSE(p.EtaSeconds().has_value());  // no rate yet
  h.now += seconds(10);
  p.Advance(25);
  ASSERT_TRUE(p.EtaSeconds().has_value());
  EXPECT_DOUBLE_EQ(*p.EtaSeconds(), 30.0);  // 75 left at 2.5/s
  h.now += seconds(10);
  p.Set(80);
  EXPECT_DOUBLE_EQ(*p.EtaSeconds(), 5.0);  // 20 left at 4/s
  p.Set(120);                              // more than planned: nothing left
  EXPECT_DOUBLE_EQ(*p.EtaSeconds(), 0.0);
}

TEST(Progress, UnknownTotalHasNoEta) {
  Harness h;
  Progress p(h.Options(ProgressMode::kSilent, 0));
  h.now += seconds(3);
  p.Advance(7);
  EXPECT_FALSE(p.EtaSeconds().has_value());
  EXPECT_EQ(p.Render(), "tactics 7 layers elapsed 3s");
}

TEST(Progress, PlainLinesEveryInterval) {
  Harness h;
  auto o = h.Options(ProgressMode::kLines, 10);
  o.line_interval = seconds(5);
  {
    Progress p(o);
    h.now += seconds(1);
    p.Advance();  // before the first interval: silent
    EXPECT_TRUE(h.writes.empty());
    h.now += seconds(4);
    p.Advance();  // 5 s: a line
    ASSERT_EQ(h.writes.size(), 1u);
    EXPECT_EQ(h.writes[0], "tactics 2/10 layers elapsed 5s ETA 20s\n");
    h.now += seconds(2);
    p.Advance();
    p.SetBest("1.25 ms");
    EXPECT_EQ(h.writes.size(), 1u);  // not due yet
    h.now += seconds(3);
    p.Tick();  // a wait with no progress still prints when due
    ASSERT_EQ(h.writes.size(), 2u);
    EXPECT_EQ(h.writes[1], "tactics 3/10 layers elapsed 10s ETA 23s best 1.25 ms\n");
    p.Finish();
    ASSERT_EQ(h.writes.size(), 3u);
    EXPECT_EQ(h.writes[2], "tactics 3/10 layers elapsed 10s done best 1.25 ms\n");
    p.Advance();  // after Finish: nothing
  }
  EXPECT_EQ(h.writes.size(), 3u);
}

TEST(Progress, BarIsRedrawnInPlaceAtMostEveryBarInterval) {
  Harness h;
  auto o = h.Options(ProgressMode::kBar, 1000);
  o.bar_interval = milliseconds(100);
  o.bar_width = 10;
  Progress p(o);
  // 1000 updates over 1 s (one per ms): the bar is drawn at most ~11 times.
  for (int i = 0; i < 1000; ++i) {
    h.now += milliseconds(1);
    p.Advance();
  }
  EXPECT_GE(h.writes.size(), 9u);
  EXPECT_LE(h.writes.size(), 11u);
  for (const auto& w : h.writes) {
    EXPECT_EQ(w.front(), '\r');
    EXPECT_EQ(w.find('\n'), std::string::npos);
  }
  EXPECT_NE(h.writes.back().find("[#########.] 901/1000"), std::string::npos) << h.writes.back();
  p.Finish();  // the final state is always drawn, ending the line
  EXPECT_EQ(h.writes.back(), "\rtactics [##########] 1000/1000 layers elapsed 1s done\n");
}

TEST(Progress, PhaseEventsAndPhaseMetric) {
  Harness h;
  {
    Progress p(h.Options(ProgressMode::kSilent, 4));
    h.now += seconds(2);
    p.Advance(4);
  }  // destructor finishes the phase
  ASSERT_EQ(h.events.size(), 2u);
  EXPECT_EQ(h.Field(h.events[0], "event"), "phase_start");
  EXPECT_EQ(h.Field(h.events[0], "phase"), "tactics");
  EXPECT_EQ(h.Field(h.events[0], "total"), "4");
  EXPECT_EQ(h.Field(h.events[1], "event"), "phase_end");
  EXPECT_EQ(h.Field(h.events[1], "seconds"), "2.000");
  EXPECT_EQ(h.Field(h.events[1], "ok"), "true");
  EXPECT_EQ(h.Field(h.events[1], "done"), "4");
  EXPECT_EQ(
      testing::SampleValue(h.metrics.Serialize(), "kiln_phase_seconds_sum{phase=\"tactics\"}"),
      2.0);
}

TEST(Progress, EventsModeForJsonPipelines) {
  Harness h;
  auto o = h.Options(ProgressMode::kEvents, 10);
  o.line_interval = seconds(1);
  Progress p(o);
  h.now += seconds(1);
  p.Advance(5);
  p.Finish(false);
  EXPECT_TRUE(h.writes.empty());
  ASSERT_EQ(h.events.size(), 3u);
  EXPECT_EQ(h.Field(h.events[1], "event"), "progress");
  EXPECT_EQ(h.Field(h.events[1], "done"), "5");
  EXPECT_EQ(h.Field(h.events[1], "eta_seconds"), "1.0");
  EXPECT_EQ(h.Field(h.events[2], "ok"), "false");
  EXPECT_EQ(h.events[2].level, LogLevel::kWarn);
}

TEST(Progress, FormatDuration) {
  EXPECT_EQ(Progress::FormatDuration(0.4), "0s");
  EXPECT_EQ(Progress::FormatDuration(45), "45s");
  EXPECT_EQ(Progress::FormatDuration(187), "3m07s");
  EXPECT_EQ(Progress::FormatDuration(3720), "1h02m");
  EXPECT_EQ(Progress::FormatDuration(-1), "?");
}

}  // namespace
}  // namespace kiln::obs
