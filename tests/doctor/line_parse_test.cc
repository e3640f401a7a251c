// Timestamp and writer (host, rank, pid, device) parsing for every log format the doctor reads.
#include <gtest/gtest.h>

#include "kiln/doctor/line_parse.h"

namespace kiln::doctor {
namespace {

using Kind = LineTime::Kind;

TEST(LineParse, Dmesg) {
  LineInfo i = ParseLine("[ 8790.332218] NVRM: Xid (PCI:0000:c6:00): 79, pid=1");
  EXPECT_EQ(i.time.kind, Kind::kBootRelative);
  EXPECT_EQ(i.time.us, 8790332218);
  EXPECT_EQ(i.body, "NVRM: Xid (PCI:0000:c6:00): 79, pid=1");
}

TEST(LineParse, DmesgHumanTime) {
  LineInfo i = ParseLine("[Sat Jun 20 12:34:56 2026] NVRM: Xid");
  EXPECT_EQ(i.time.kind, Kind::kAbsolute);
  EXPECT_EQ(FormatTimeUs(i.time.us), "2026-06-20 12:34:56.000");
}

TEST(LineParse, SyslogWithKernelStamp) {
  LineInfo i = ParseLine("Jun 20 12:34:56 gpu-node-a kernel: [ 8790.332218] NVRM: Xid");
  EXPECT_EQ(i.time.kind, Kind::kNoYear);
  EXPECT_EQ(i.time.month, 6);
  EXPECT_EQ(i.time.day, 20);
  EXPECT_EQ(i.time.us, (12 * 3600 + 34 * 60 + 56) * 1000000LL);
  EXPECT_EQ(i.time.kernel_rel_us, 8790332218);
  EXPECT_EQ(i.host, "gpu-node-a");
  EXPECT_EQ(i.body, "NVRM: Xid");
}

TEST(LineParse, TensorRtCppAndPythonLoggerOrders) {
  // trtexec and the C++ samples print "[E] [TRT]", the Python logger "[TRT] [E]": same time.
  LineInfo c =
      ParseLine("[06/20/2026-08:15:02] [E] [TRT] 1: Error Code 1: Cuda Runtime (out of memory)");
  LineInfo p =
      ParseLine("[06/20/2026-08:15:02] [TRT] [E] 1: Error Code 1: Cuda Runtime (out of memory)");
  EXPECT_EQ(c.time.kind, Kind::kAbsolute);
  EXPECT_EQ(FormatTimeUs(c.time.us), "2026-06-20 08:15:02.000");
  EXPECT_EQ(c.time.us, p.time.us);
}

TEST(LineParse, SlurmLabelGivesTheRank) {
  LineInfo i = ParseLine(" 3: [06/20/2026-08:15:02] [TRT] [E] OutOfMemory");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(FormatTimeUs(i.time.us), "2026-06-20 08:15:02.000");
  EXPECT_EQ(i.unwrapped, "[06/20/2026-08:15:02] [TRT] [E] OutOfMemory");
  LineInfo j = ParseLine("12: export NCCL_IB_TIMEOUT=30");
  EXPECT_EQ(j.rank, 12);
  EXPECT_EQ(j.body, "export NCCL_IB_TIMEOUT=30");
  // A line that merely starts with a number is not a label.
  LineInfo k = ParseLine("2026-06-20 08:14:10,000 INFO step 3");
  EXPECT_EQ(k.rank, -1);
  EXPECT_EQ(FormatTimeUs(k.time.us), "2026-06-20 08:14:10.000");
}

TEST(LineParse, KubernetesPrefixAndTimestamps) {
  LineInfo i = ParseLine(
      "[pod/encoder-build-0/trainer] 2026-06-20T08:14:52.118230001Z [rank1]:[06/20/2026-08:14:52] "
      "[TRT] [E] 2: Error Code 2: OutOfMemory");
  EXPECT_EQ(i.host, "encoder-build-0");
  EXPECT_EQ(i.rank, 1);
  EXPECT_EQ(FormatTimeUs(i.time.us), "2026-06-20 08:14:52.000");  // the program's own time wins
  // Without a time of its own the line takes the kubelet's.
  LineInfo j = ParseLine("2026-06-20T08:14:11.500000001Z UserWarning: TypedStorage is deprecated");
  EXPECT_EQ(j.time.kind, Kind::kAbsolute);
  EXPECT_EQ(FormatTimeUs(j.time.us), "2026-06-20 08:14:11.500");
  EXPECT_EQ(j.body, "UserWarning: TypedStorage is deprecated");
  // journalctl -o short-iso is a syslog line, not a wrapper: the host is kept.
  LineInfo k =
      ParseLine("2026-06-20T08:14:33+00:00 gpu-node-6 kernel: NVRM: Xid (PCI:0000:ba:00): 94");
  EXPECT_EQ(k.host, "gpu-node-6");
  EXPECT_EQ(k.body, "NVRM: Xid (PCI:0000:ba:00): 94");
}

TEST(LineParse, JournaldShortPreciseAndDmesgFacility) {
  LineInfo i =
      ParseLine("Jun 20 08:14:31.554120 gpu-node-5 kernel: NVRM: Xid (PCI:0000:5d:00): 43");
  EXPECT_EQ(i.time.kind, Kind::kNoYear);
  EXPECT_EQ(i.time.us, (8 * 3600 + 14 * 60 + 31) * 1000000LL + 554120);
  EXPECT_EQ(i.host, "gpu-node-5");
  LineInfo x = ParseLine("kern  :err   : [ 8790.332218] NVRM: Xid (PCI:0000:c6:00): 79, pid=1");
  EXPECT_EQ(x.time.kind, Kind::kBootRelative);
  EXPECT_EQ(x.time.us, 8790332218);
  EXPECT_EQ(x.body, "NVRM: Xid (PCI:0000:c6:00): 79, pid=1");
}

TEST(LineParse, Rfc3339Syslog) {
  LineInfo i = ParseLine("2026-06-20T12:34:56.250000+02:00 gpu-node-b kernel: NVRM: Xid");
  EXPECT_EQ(i.time.kind, Kind::kAbsolute);
  EXPECT_EQ(FormatTimeUs(i.time.us), "2026-06-20 10:34:56.250");
  EXPECT_EQ(i.host, "gpu-node-b");
}

TEST(LineParse, PyTorchC10WithRankPrefix) {
  LineInfo i = ParseLine(
      "[rank3]:[E620 12:34:56.789012 1234 ProcessGroupNCCL.cpp:616] [PG 0 Rank 3] Watchdog caught");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.level, 'E');
  EXPECT_EQ(i.time.kind, Kind::kNoYear);
  EXPECT_EQ(i.time.month, 6);
  EXPECT_EQ(i.time.day, 20);
  EXPECT_EQ(i.time.us % 1000000, 789012);
  EXPECT_EQ(i.body, "[PG 0 Rank 3] Watchdog caught");
}

TEST(LineParse, GlogFourDigitDateAndPgRankOnly) {
  LineInfo i = ParseLine("[E1002 01:01:54.018722820 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog");
  EXPECT_EQ(i.time.month, 10);
  EXPECT_EQ(i.time.day, 2);
  EXPECT_EQ(i.time.us % 1000000, 18722);  // nanoseconds truncated to microseconds
  EXPECT_EQ(i.rank, 5);
}

TEST(LineParse, TensorRT) {
  LineInfo i = ParseLine("[rank2]:[06/20/2026-12:34:55] [TRT] [E] 1: Error Code 1: Cuda Runtime");
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.time.kind, Kind::kAbsolute);
  EXPECT_EQ(FormatTimeUs(i.time.us), "2026-06-20 12:34:55.000");
  EXPECT_EQ(i.body, "[TRT] [E] 1: Error Code 1: Cuda Runtime");
}

TEST(LineParse, PythonLoggingAndTorchrun) {
  LineInfo i = ParseLine(
      "[2026-06-20 12:35:10,102] torch.distributed.elastic.multiprocessing.api: [ERROR] failed");
  EXPECT_EQ(i.time.kind, Kind::kAbsolute);
  EXPECT_EQ(FormatTimeUs(i.time.us), "2026-06-20 12:35:10.102");
  EXPECT_TRUE(i.host.empty());
}

TEST(LineParse, Nccl) {
  LineInfo i = ParseLine("gpu-node-b:60120:60188 [3] NCCL WARN NET/IB : Got completion");
  EXPECT_EQ(i.host, "gpu-node-b");
  EXPECT_EQ(i.pid, 60120);
  EXPECT_EQ(i.cuda_dev, 3);
  EXPECT_EQ(i.time.kind, Kind::kNone);
  EXPECT_EQ(i.body, "NCCL WARN NET/IB : Got completion");
}

TEST(LineParse, TorchrunLocalRankPrefixThenNccl) {
  LineInfo i = ParseLine("[default3]:node-1:77:78 [3] NCCL INFO Init COMPLETE");
  EXPECT_EQ(i.local_rank, 3);
  EXPECT_EQ(i.host, "node-1");
}

TEST(LineParse, NvidiaSmiCsvAndKilnJson) {
  LineInfo csv = ParseLine("2026/06/20 08:15:00.412, 0, NVIDIA A100-SXM4-40GB, 40200 MiB");
  EXPECT_EQ(FormatTimeUs(csv.time.us), "2026-06-20 08:15:00.412");
  LineInfo js = ParseLine(R"({"ts":1781949601.502004,"level":"ERROR","msg":"KILN-E3002"})");
  EXPECT_EQ(js.time.kind, Kind::kAbsolute);
  EXPECT_EQ(js.time.us, 1781949601502004);
  EXPECT_EQ(js.level, 'E');
  LineInfo text = ParseLine("[kiln WARN BUILD] KILN-E3005 timing cache ignored");
  EXPECT_EQ(text.level, 'W');
  EXPECT_EQ(text.body, "KILN-E3005 timing cache ignored");
}

TEST(LineParse, PlainLinesAndGarbage) {
  EXPECT_EQ(ParseLine("hello world").time.kind, Kind::kNone);
  EXPECT_EQ(ParseLine("").time.kind, Kind::kNone);
  EXPECT_EQ(ParseLine("[").time.kind, Kind::kNone);
  EXPECT_EQ(ParseLine("[ 12.3]").time.kind, Kind::kNone);
  EXPECT_EQ(ParseLine("Jun").time.kind, Kind::kNone);
  EXPECT_EQ(ParseLine("\xff\xfe\x00").time.kind, Kind::kNone);
}

TEST(LineParse, CivilTimeRoundTrip) {
  EXPECT_EQ(CivilToUnixUs(1970, 1, 1, 0, 0, 0, 0), 0);
  EXPECT_EQ(FormatTimeUs(CivilToUnixUs(2024, 2, 29, 23, 59, 59, 999000)),
            "2024-02-29 23:59:59.999");
  EXPECT_EQ(NoYearToUnixUs(2026, 6, 20, 0), CivilToUnixUs(2026, 6, 20, 0, 0, 0, 0));
}

}  // namespace
}  // namespace kiln::doctor
