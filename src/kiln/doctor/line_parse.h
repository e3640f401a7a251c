// Reads the prefixes of one log line: timestamps in the formats of the usual stack (dmesg, syslog,
// glog/PyTorch, TensorRT, python logging, nvidia-smi CSV, kiln) and who wrote it (host, rank, pid,
// CUDA device), under the wrappers launchers add to every line (Slurm, Kubernetes). Runs only on
// lines that matched a signature, so clarity beats speed here.
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln::doctor {

struct LineTime {
  enum class Kind : uint8_t { kNone, kAbsolute, kNoYear, kBootRelative };
  Kind kind = Kind::kNone;
  // kAbsolute: microseconds since the Unix epoch (UTC assumed when the log has no zone).
  // kNoYear: microseconds since January 1st 00:00 of a year resolved later (syslog, glog).
  // kBootRelative: microseconds since boot (dmesg).
  int64_t us = 0;
  int month = 0, day = 0;      // kNoYear
  int64_t kernel_rel_us = -1;  // a syslog kernel line also carrying "[ 1234.567890]"
};

struct LineInfo {
  LineTime time;
  std::string_view host;
  int rank = -1;
  int local_rank = -1;
  int cuda_dev = -1;
  int64_t pid = -1;
  char level = 0;         // 'E', 'W', 'I', 'D' when the format carries one
  std::string_view body;  // the line after the recognised prefixes
  // The line after launcher wrappers only (Kubernetes `--timestamps`/`--prefix`, Slurm
  // `srun --label`, dmesg `-x` facility): what the program itself printed.
  std::string_view unwrapped;
};

LineInfo ParseLine(std::string_view line);

// Days-from-civil; no time zone, no leap seconds.
int64_t CivilToUnixUs(int year, int month, int day, int hour, int minute, int second,
                      int64_t micros);
// Microseconds since January 1st of `year` for a month/day/time-of-day.
int64_t NoYearToUnixUs(int year, int month, int day, int64_t us_of_day);
// "2026-06-20 12:34:56.789" (UTC) from Unix microseconds.
std::string FormatTimeUs(int64_t us, bool with_date = true);

}  // namespace kiln::doctor
