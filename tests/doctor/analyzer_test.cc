// Log analyzer behaviour on hostile and large input: garbage bytes, invalid UTF-8, NUL bytes,
// lines longer than a chunk, many matches, de-duplication and time anchoring.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/doctor/log_analyzer.h"
#include "kiln/doctor/report.h"

namespace kiln::doctor {
namespace {

std::unique_ptr<LogAnalyzer> MakeAnalyzer(AnalyzerOptions opts = {}) {
  auto db = SignatureDb::Default();
  auto kp = KnownProblems::Default();
  EXPECT_TRUE(db.ok() && kp.ok());
  auto a = LogAnalyzer::Create(*db, *kp, opts);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(a).value();
}

std::shared_ptr<const SignatureDb> Db() { return *SignatureDb::Default(); }

const Event& Root(const Diagnosis& d) {
  EXPECT_GE(d.root, 0);
  return d.events[d.root];
}

TEST(Analyzer, GarbageAndInvalidUtf8AroundAFault) {
  std::mt19937 rng(42);
  std::string data;
  // 1 MiB of random bytes (NULs, invalid UTF-8, stray newlines) ...
  for (int i = 0; i < (1 << 20); ++i) data += static_cast<char>(rng() & 0xff);
  data += "\n";
  // ... then a real kernel line wrapped in invalid bytes, then more garbage.
  data +=
      "\xff\xfe[ 8790.332218] NVRM: Xid (PCI:0000:c6:00): 79, pid='<unknown>', name=\xc3\x28, "
      "GPU has fallen off the bus.\xc0\n";
  for (int i = 0; i < (1 << 18); ++i) data += static_cast<char>(rng() & 0xff);
  auto a = MakeAnalyzer();
  a->AddBuffer("garbage.log", data);
  Diagnosis d = a->Finish();
  ASSERT_EQ(d.verdict, Diagnosis::Verdict::kFailure);
  const Event& r = Root(d);
  EXPECT_EQ(r.id, "xid.79");
  EXPECT_EQ(r.gpu, "0000:c6:00");
  // The line number counts every newline of the random prefix.
  uint64_t expected_line =
      std::count(data.begin(), data.begin() + data.find("\xff\xfe[ 8790"), '\n') + 1;
  EXPECT_EQ(r.line, expected_line);
  // The evidence text is valid UTF-8: JSON serialisation (which rejects invalid UTF-8) succeeds.
  std::string json;
  EXPECT_NO_THROW(json = DiagnosisToJson(d, *Db()).dump());
  EXPECT_NE(json.find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD where bytes were invalid
}

TEST(Analyzer, SanitizeReplacesInvalidSequencesAndControls) {
  EXPECT_EQ(SanitizeText("ok \xff\xfe x", 100), "ok \xef\xbf\xbd\xef\xbf\xbd x");
  EXPECT_EQ(SanitizeText("a\xc3\x28", 100), "a\xef\xbf\xbd(");
  EXPECT_EQ(SanitizeText("caf\xc3\xa9", 100), "caf\xc3\xa9");
  EXPECT_EQ(SanitizeText("tab\there\x01", 100), "tab here ");
  EXPECT_EQ(SanitizeText("\x1b[1;31mred\x1b[0m", 100), "red");
  EXPECT_EQ(SanitizeText("abcdef", 3), "abc");
  EXPECT_EQ(SanitizeText(std::string("nul\0byte", 8), 100), "nul byte");
}

TEST(Analyzer, LargeGeneratedInputFindsTheOneFailureAndCountsLines) {
  std::string data;
  const int kLines = 400000;  // about 40 MB
  data.reserve(kLines * 100);
  for (int i = 0; i < kLines; ++i) {
    if (i % 3 == 0) {
      data += fmt::format(
          "node-7:4242:4300 [3] NCCL INFO Channel {:02}/32 : 3[3] -> 4[4] via P2P/CUMEM/read\n",
          i % 32);
    } else {
      data += fmt::format(
          "[rank3]:[2026-06-20 10:{:02}:{:02},000] train: [INFO] step {} loss 1.{:03} tokens/s "
          "402113\n",
          i / 60000 % 60, i / 1000 % 60, i, i % 1000);
    }
  }
  data += "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n";
  AnalyzerOptions opts;
  opts.chunk_bytes = 1 << 20;
  auto a = MakeAnalyzer(opts);
  a->AddBuffer("big.log", data);
  Diagnosis d = a->Finish();
  EXPECT_EQ(d.lines, static_cast<uint64_t>(kLines + 1));
  EXPECT_EQ(d.bytes, data.size());
  ASSERT_EQ(d.verdict, Diagnosis::Verdict::kFailure);
  EXPECT_EQ(Root(d).id, "cuda.700");
  EXPECT_EQ(Root(d).line, static_cast<uint64_t>(kLines + 1));
  EXPECT_EQ(Root(d).rank, 3);
  EXPECT_TRUE(d.consequences.empty());
}

TEST(Analyzer, LineLongerThanAChunkAndLastLineWithoutNewline) {
  std::string data = std::string(20000, 'x') + "\n";
  data +=
      "Jun 20 12:00:00 host-1 kernel: [  100.000001] NVRM: Xid (PCI:0000:3b:00): 48, pid=7, "
      "name=python, An uncorrectable double bit error (DBE) has been detected\n";
  data += "[rank0]: RuntimeError: CUDA error: unspecified launch failure";  // no final newline
  AnalyzerOptions opts;
  opts.chunk_bytes = 4096;
  auto a = MakeAnalyzer(opts);
  a->AddBuffer("long.log", data);
  Diagnosis d = a->Finish();
  EXPECT_EQ(Root(d).id, "xid.48");
  EXPECT_EQ(Root(d).line, 2u);
  ASSERT_EQ(d.consequences.size(), 1u);
  EXPECT_EQ(d.consequences[0].id, "cuda.719");
  EXPECT_EQ(d.events[d.consequences[0].first].line, 3u);
}

TEST(Analyzer, BenignTextInventsNothing) {
  std::string data;
  std::mt19937 rng(7);
  const char* words[] = {"epoch", "loss",         "NCCL",        "INFO",   "error_rate=0.00",
                         "Xid",   "warning-free", "timeout=600", "memory", "CUDA",
                         "ok",    "rank",         "build",       "engine"};
  for (int i = 0; i < 20000; ++i) {
    for (int w = 0; w < 8; ++w) data += std::string(words[rng() % std::size(words)]) + " ";
    data += "\n";
  }
  auto a = MakeAnalyzer();
  a->AddBuffer("benign.log", data);
  Diagnosis d = a->Finish();
  EXPECT_EQ(d.verdict, Diagnosis::Verdict::kHealthy);
  EXPECT_EQ(d.ExitCode(), 0);
  EXPECT_TRUE(d.events.empty());
}

TEST(Analyzer, DmesgAndKernLogOfOneEventCountOnceAndAnchorTime) {
  auto a = MakeAnalyzer();
  a->AddBuffer("node-a/kern.log",
               "Jun 20 11:40:01 node-a kernel: [ 8790.332218] NVRM: Xid (PCI:0000:c6:00): 79, "
               "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n");
  a->AddBuffer(
      "node-a/dmesg.txt",
      "[ 8790.332218] NVRM: Xid (PCI:0000:c6:00): 79, pid='<unknown>', name=<unknown>, GPU "
      "has fallen off the bus.\n"
      "[ 8795.000000] NVRM: Xid (PCI:0000:c6:00): 154, pid='<unknown>', name=<unknown>, GPU "
      "recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)\n");
  Diagnosis d = a->Finish();
  int xid79 = 0;
  for (const Event& e : d.events) xid79 += e.id == "xid.79";
  EXPECT_EQ(xid79, 1);
  ASSERT_EQ(d.consequences.size(), 1u);
  const Event& x154 = d.events[d.consequences[0].first];
  EXPECT_EQ(x154.host, "node-a");
  ASSERT_NE(x154.time_us, kNoTime);
  // Anchored through the kern.log line: 11:40:01 - 8790.332218 s + 8795 s.
  EXPECT_EQ(FormatTimeUs(x154.time_us).substr(11), "11:40:05.667");
  EXPECT_EQ(x154.Field("action"), "Node Reboot Required");
}

TEST(Analyzer, GenericEntriesGiveWayToSpecificOnes) {
  auto a = MakeAnalyzer();
  a->AddBuffer("trt.log",
               "[06/20/2026-08:15:02] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] "
               "Error Code 2: OutOfMemory (no further information)\n");
  Diagnosis d = a->Finish();
  ASSERT_EQ(d.events.size(), 1u);
  EXPECT_EQ(d.events[0].id, "trt.oom");
  EXPECT_EQ(d.events[0].role, Role::kResource);
}

TEST(Analyzer, KilnCodesComeFromTheCatalog) {
  auto a = MakeAnalyzer();
  a->AddBuffer("kiln.log",
               "[kiln ERROR BUILD] KILN-E3002 [plan] needs 41 GiB code=KILN-E3002\n"
               "[kiln WARN BUILD] KILN-E3005 [build] timing cache ignored\n"
               "[kiln ERROR BUILD] KILN-E0042 from a future kiln\n");
  Diagnosis d = a->Finish();
  const Event& r = Root(d);
  EXPECT_EQ(r.id, "kiln.KILN-E3002");
  EXPECT_EQ(r.role, Role::kResource);
  EXPECT_EQ(r.meaning, LookupError(ErrorCode::kMemoryBudgetExceeded).summary);
  EXPECT_EQ(r.remedy, LookupError(ErrorCode::kMemoryBudgetExceeded).remedy);
  std::vector<std::string> warns;
  for (const auto& g : d.warnings) warns.push_back(g.id);
  EXPECT_EQ(warns, (std::vector<std::string>{"kiln.KILN-E3005", "kiln.KILN-E0042"}));
  EXPECT_EQ(d.events.size(), 3u);  // the code twice on one line is one event
}

TEST(Analyzer, ManyMatchesAreCappedWithANote) {
  std::string data;
  for (int i = 0; i < 3000; ++i) {
    data += fmt::format(
        "[rank{}]:[E620 12:10:03.400000 1 ProcessGroupNCCL.cpp:616] [PG 0 Rank {}] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600104 milliseconds before timing out.\n",
        i, i);
  }
  AnalyzerOptions opts;
  opts.max_events_per_signature = 100;
  auto a = MakeAnalyzer(opts);
  a->AddBuffer("many.log", data);
  Diagnosis d = a->Finish();
  EXPECT_EQ(d.events.size(), 100u);
  ASSERT_FALSE(d.notes.empty());
  EXPECT_NE(d.notes[0].find("matched 3000 lines"), std::string::npos);
  // Only consequences: the first is reported as such, with the note that the cause is elsewhere.
  EXPECT_EQ(Root(d).id, "torch.watchdog-timeout");
  EXPECT_NE(d.root_note.find("no underlying fault"), std::string::npos);
  ASSERT_EQ(d.consequences.size(), 1u);
  EXPECT_EQ(d.consequences[0].count, 2999u);  // every match counts, not only the kept ones
  EXPECT_EQ(Root(d).Field("seq"), "3");
  EXPECT_EQ(Root(d).Field("ran_ms"), "600104");
}

TEST(Analyzer, FilesOnDiskAndCompressedFiles) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("kiln_doctor_{}", getpid());
  std::filesystem::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "a.log") << "NCCL_IB_TIMEOUT=25\n";
  std::ofstream(dir / "b.log.gz", std::ios::binary) << std::string("\x1f\x8b\x08\x00rest", 8);
  auto d = DiagnoseLogs({dir.string()});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->files.size(), 2u);
  EXPECT_EQ(d->verdict, Diagnosis::Verdict::kWarnings);
  EXPECT_EQ(d->ExitCode(), 1);
  ASSERT_EQ(d->warnings.size(), 1u);
  EXPECT_EQ(d->warnings[0].id, "env.NCCL_IB_TIMEOUT");
  bool gz_note = false;
  for (const auto& n : d->notes) gz_note |= n.find("gzip") != std::string::npos;
  EXPECT_TRUE(gz_note);
  auto missing = DiagnoseLogs({(dir / "nope").string()});
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(Analyzer, SpecialFilesAreRefusedUnlessAllowedAndReadsAreCapped) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("kiln_doctor_cap_{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "pipe.log").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO with no writer: refused at once, without waiting for a writer to appear.
  Status s = MakeAnalyzer()->AddFile(fifo);
  EXPECT_EQ(s.code(), ErrorCode::kLogFileNotRegular) << s.ToString();
  EXPECT_NE(s.message().find("FIFO"), std::string::npos) << s.message();
  EXPECT_EQ(MakeAnalyzer()->AddFile("/dev/zero").code(), ErrorCode::kLogFileNotRegular);

  // Allowed, /dev/zero is read up to the cap, and the diagnosis says the rest was skipped.
  AnalyzerOptions capped;
  capped.allow_special_files = true;
  capped.max_file_bytes = 3 << 20;
  capped.chunk_bytes = 1 << 20;
  auto zero = MakeAnalyzer(capped);
  ASSERT_TRUE(zero->AddFile("/dev/zero").ok());
  Diagnosis d = zero->Finish();
  EXPECT_EQ(d.bytes, uint64_t{3} << 20);
  bool cut = false;
  for (const auto& n : d.notes) cut |= n.find("only the first 3 MiB") != std::string::npos;
  EXPECT_TRUE(cut);

  // A regular file over the cap: its first lines are scanned, the note names it.
  const std::string big = (dir / "big.log").string();
  {
    std::ofstream f(big);
    f << "NCCL_IB_TIMEOUT=25\n";
    for (int i = 0; i < 200000; ++i) f << "an ordinary line of a long log file\n";  // ~7 MiB
  }
  AnalyzerOptions one_mib;
  one_mib.max_file_bytes = 1 << 20;
  auto a = MakeAnalyzer(one_mib);
  ASSERT_TRUE(a->AddFile(big).ok());
  Diagnosis db = a->Finish();
  EXPECT_EQ(db.bytes, uint64_t{1} << 20);
  ASSERT_EQ(db.warnings.size(), 1u);
  EXPECT_EQ(db.warnings[0].id, "env.NCCL_IB_TIMEOUT");
  bool big_cut = false;
  for (const auto& n : db.notes) {
    big_cut |= n.find("big.log") != std::string::npos && n.find("first 1 MiB") != std::string::npos;
  }
  EXPECT_TRUE(big_cut);
  // Under the cap: no note.
  auto whole = MakeAnalyzer();
  ASSERT_TRUE(whole->AddFile(big).ok());
  for (const auto& n : whole->Finish().notes)
    EXPECT_EQ(n.find("only the first"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Analyzer, ReportTextPutsTheRootCauseFirst) {
  auto a = MakeAnalyzer();
  a->AddBuffer("x.log",
               "Jun 20 11:40:01 node-a kernel: NVRM: Xid (PCI:0000:c6:00): 79, pid='<unknown>', "
               "name=<unknown>, GPU has fallen off the bus.\n"
               "[rank9]:[E620 11:50:02.300100 1 ProcessGroupNCCL.cpp:616] [Rank 9] Watchdog caught "
               "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 "
               "milliseconds before timing out.\n");
  Diagnosis d = a->Finish();
  std::string text = RenderDiagnosisText(d, *Db(), {});
  size_t root = text.find("ROOT CAUSE"), then = text.find("THEN"), ev = text.find("EVIDENCE"),
         todo = text.find("WHAT TO DO");
  ASSERT_NE(root, std::string::npos);
  EXPECT_LT(root, then);
  EXPECT_LT(then, ev);
  EXPECT_LT(ev, todo);
  EXPECT_NE(text.find("x.log:1"), std::string::npos);
  EXPECT_EQ(text.find("\x1b["), std::string::npos);  // no colour unless asked
  EXPECT_NE(RenderDiagnosisText(d, *Db(), {.color = true}).find("\x1b["), std::string::npos);
  auto j = DiagnosisToJson(d, *Db());
  EXPECT_EQ(j["root_cause"]["id"], "xid.79");
  EXPECT_EQ(j["consequences"][0]["ranks"][0], 9);
  EXPECT_EQ(j["exit_code"], 2);
}

}  // namespace
}  // namespace kiln::doctor
