// Log line prefix parsing (see line_parse.h).
#include "kiln/doctor/line_parse.h"

#include <fmt/format.h>

#include <string>

namespace kiln::doctor {

namespace {

constexpr std::string_view kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A tiny cursor over the line; every Read* leaves the cursor unchanged when it fails.
struct Cursor {
  std::string_view s;
  size_t i = 0;

  bool Eat(char c) {
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool Eat(std::string_view t) {
    if (s.substr(i).starts_with(t)) {
      i += t.size();
      return true;
    }
    return false;
  }
  void Spaces() {
    while (i < s.size() && s[i] == ' ') ++i;
  }
  // Exactly n digits (n > 0) or, with n == 0, one or more.
  bool Num(int64_t* v, int n = 0) {
    size_t j = i;
    int64_t x = 0;
    while (j < s.size() && IsDigit(s[j]) && (n == 0 || static_cast<int>(j - i) < n)) {
      x = x * 10 + (s[j] - '0');
      ++j;
    }
    if (j == i || (n > 0 && static_cast<int>(j - i) != n)) return false;
    *v = x;
    i = j;
    return true;
  }
  // Fraction digits after '.' or ',' as microseconds (any number of digits).
  int64_t Frac() {
    if (i < s.size() && (s[i] == '.' || s[i] == ',') && i + 1 < s.size() && IsDigit(s[i + 1])) {
      ++i;
      int64_t us = 0;
      int digits = 0;
      while (i < s.size() && IsDigit(s[i])) {
        if (digits < 6) us = us * 10 + (s[i] - '0');
        ++digits;
        ++i;
      }
      for (; digits < 6; ++digits) us *= 10;
      return us;
    }
    return 0;
  }
  bool Month(int* m) {
    for (int k = 0; k < 12; ++k) {
      if (s.substr(i).starts_with(kMonths[k])) {
        *m = k + 1;
        i += 3;
        return true;
      }
    }
    return false;
  }
  // HH:MM:SS[.frac] as microseconds of the day.
  bool Clock(int64_t* us) {
    size_t save = i;
    int64_t h, m, sec;
    if (Num(&h, 2) && Eat(':') && Num(&m, 2) && Eat(':') && Num(&sec, 2)) {
      *us = ((h * 60 + m) * 60 + sec) * 1000000 + Frac();
      return true;
    }
    i = save;
    return false;
  }
  std::string_view Token() {
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    std::string_view t = s.substr(i, j - i);
    i = j;
    return t;
  }
  std::string_view Rest() const { return s.substr(i); }
};

// "[rank3]:" or "[default3]:" (torchrun --tee / -l), repeated wrappers allowed.
bool ReadRankPrefix(Cursor& c, LineInfo& info) {
  size_t save = c.i;
  int64_t v;
  if (c.Eat("[rank") && c.Num(&v) && c.Eat("]:")) {
    info.rank = static_cast<int>(v);
    return true;
  }
  c.i = save;
  if (c.Eat('[')) {
    size_t j = c.i;
    while (j < c.s.size() && std::isalpha(static_cast<unsigned char>(c.s[j]))) ++j;
    if (j > c.i) {
      c.i = j;
      if (c.Num(&v) && c.Eat("]:")) {
        info.local_rank = static_cast<int>(v);
        return true;
      }
    }
  }
  c.i = save;
  return false;
}

bool ReadIsoDateTime(Cursor& c, LineTime& t) {
  size_t save = c.i;
  int64_t y, mo, d, clock;
  if (c.Num(&y, 4) && c.Eat('-') && c.Num(&mo, 2) && c.Eat('-') && c.Num(&d, 2) &&
      (c.Eat('T') || c.Eat(' ')) && c.Clock(&clock)) {
    int64_t us =
        CivilToUnixUs(static_cast<int>(y), static_cast<int>(mo), static_cast<int>(d), 0, 0, 0, 0) +
        clock;
    if (c.Eat('Z')) {
    } else if (c.i < c.s.size() && (c.s[c.i] == '+' || c.s[c.i] == '-')) {
      int sign = c.s[c.i] == '-' ? -1 : 1;
      size_t z = c.i;
      ++c.i;
      int64_t zh, zm = 0;
      if (c.Num(&zh, 2) && (c.Eat(':') || true) && (c.Num(&zm, 2) || true)) {
        us -= sign * (zh * 60 + zm) * 60 * 1000000;
      } else {
        c.i = z;
      }
    }
    t.kind = LineTime::Kind::kAbsolute;
    t.us = us;
    return true;
  }
  c.i = save;
  return false;
}

bool ReadTime(Cursor& c, LineInfo& info) {
  LineTime& t = info.time;
  size_t save = c.i;
  int64_t v, v2, clock;
  // dmesg: "[12345.678901]" (spaces allowed after '[')
  if (c.Eat('[')) {
    c.Spaces();
    if (c.Num(&v) && c.Eat('.') && c.Num(&v2, 6) && c.Eat(']')) {
      t.kind = LineTime::Kind::kBootRelative;
      t.us = v * 1000000 + v2;
      return true;
    }
  }
  c.i = save;
  // dmesg -T: "[Sat Jun 20 12:34:56 2026]"
  if (c.Eat('[') && c.Token().size() == 3 && c.Eat(' ')) {
    int m;
    c.Spaces();
    if (c.Month(&m) && c.Eat(' ')) {
      c.Spaces();
      int64_t y;
      if (c.Num(&v) && c.Eat(' ') && c.Clock(&clock) && c.Eat(' ') && c.Num(&y, 4) && c.Eat(']')) {
        t.kind = LineTime::Kind::kAbsolute;
        t.us = CivilToUnixUs(static_cast<int>(y), m, static_cast<int>(v), 0, 0, 0, 0) + clock;
        return true;
      }
    }
  }
  c.i = save;
  // TensorRT: "[06/20/2026-12:34:56]"
  {
    int64_t mo, d, y;
    if (c.Eat('[') && c.Num(&mo, 2) && c.Eat('/') && c.Num(&d, 2) && c.Eat('/') && c.Num(&y, 4) &&
        c.Eat('-') && c.Clock(&clock) && c.Eat(']')) {
      t.kind = LineTime::Kind::kAbsolute;
      t.us = CivilToUnixUs(static_cast<int>(y), static_cast<int>(mo), static_cast<int>(d), 0, 0, 0,
                           0) +
             clock;
      return true;
    }
  }
  c.i = save;
  // python logging / torchrun: "[2026-06-20 12:34:56,789]" or bare ISO / RFC 3339 syslog.
  {
    bool bracket = c.Eat('[');
    if (ReadIsoDateTime(c, t)) {
      if (bracket && !c.Eat(']')) {
        // "[2026-06-20 12:34:56,789 ...]": accept, the bracket closes later.
      }
      return true;
    }
  }
  c.i = save;
  // nvidia-smi CSV: "2026/06/20 12:34:56.789"
  {
    int64_t y, mo, d;
    if (c.Num(&y, 4) && c.Eat('/') && c.Num(&mo, 2) && c.Eat('/') && c.Num(&d, 2) && c.Eat(' ') &&
        c.Clock(&clock)) {
      t.kind = LineTime::Kind::kAbsolute;
      t.us = CivilToUnixUs(static_cast<int>(y), static_cast<int>(mo), static_cast<int>(d), 0, 0, 0,
                           0) +
             clock;
      return true;
    }
  }
  c.i = save;
  // BSD syslog: "Jun 20 12:34:56 host ..."
  {
    int m;
    if (c.Month(&m) && c.Eat(' ')) {
      c.Spaces();
      if (c.Num(&v) && c.Eat(' ') && c.Clock(&clock)) {
        t.kind = LineTime::Kind::kNoYear;
        t.month = m;
        t.day = static_cast<int>(v);
        t.us = clock;
        return true;
      }
    }
  }
  c.i = save;
  // glog / c10: "[E620 12:34:56.789012 ...]" or "E0620 12:34:56.789012 ..."
  {
    c.Eat('[');
    if (c.i < c.s.size() && std::string_view("IWEFD").find(c.s[c.i]) != std::string_view::npos) {
      char level = c.s[c.i];
      ++c.i;
      size_t start = c.i;
      int64_t mmdd;
      if (c.Num(&mmdd) && (c.i - start == 3 || c.i - start == 4) && c.Eat(' ') && c.Clock(&clock)) {
        t.kind = LineTime::Kind::kNoYear;
        t.month = static_cast<int>(mmdd / 100);
        t.day = static_cast<int>(mmdd % 100);
        t.us = clock;
        info.level = level;
        // Skip the rest of the bracket: "1234 ProcessGroupNCCL.cpp:616]".
        size_t close = c.s.find(']', c.i);
        if (close != std::string_view::npos && close - c.i < 120) c.i = close + 1;
        return true;
      }
    }
  }
  c.i = save;
  // kiln JSON log line: {"ts":1781958896.123,...,"level":"ERROR",...}
  if (c.Eat("{\"ts\":")) {
    int64_t sec;
    if (c.Num(&sec)) {
      t.kind = LineTime::Kind::kAbsolute;
      t.us = sec * 1000000 + c.Frac();
      size_t lv = c.s.find("\"level\":\"", c.i);
      if (lv != std::string_view::npos && lv + 9 < c.s.size()) info.level = c.s[lv + 9];
      return true;
    }
  }
  c.i = save;
  return false;
}

// NCCL: "host:pid:tid [cudaDev] NCCL ..."
bool ReadNcclPrefix(Cursor& c, LineInfo& info) {
  size_t save = c.i;
  size_t colon = c.s.find(':', c.i);
  if (colon == std::string_view::npos || colon == c.i) return false;
  std::string_view host = c.s.substr(c.i, colon - c.i);
  if (host.find(' ') != std::string_view::npos || host.find('[') != std::string_view::npos)
    return false;
  c.i = colon + 1;
  int64_t pid, tid, dev;
  if (c.Num(&pid) && c.Eat(':') && c.Num(&tid) && c.Eat(" [") && c.Num(&dev) && c.Eat("] ")) {
    info.host = host;
    info.pid = pid;
    info.cuda_dev = static_cast<int>(dev);
    return true;
  }
  c.i = save;
  return false;
}

// "[PG 0 Rank 3]" / "[PG ID 0 PG GUID 0(default_pg) Rank 3]" / "[Rank 3]" within the body.
void ReadPgRank(std::string_view body, LineInfo& info) {
  size_t limit = std::min<size_t>(body.size(), 240);
  for (size_t p = body.find("Rank "); p != std::string_view::npos && p < limit;
       p = body.find("Rank ", p + 1)) {
    size_t open = body.rfind('[', p);
    if (open == std::string_view::npos || p - open > 80) continue;
    std::string_view head = body.substr(open, p - open);
    if (!(head == "[" || head.starts_with("[PG"))) continue;
    Cursor c{body, p + 5};
    int64_t r;
    if (c.Num(&r) && c.Eat(']')) {
      if (info.rank < 0) info.rank = static_cast<int>(r);
      return;
    }
  }
}

// Prefixes that launchers and collectors put before every line the program printed:
//   kubectl logs --timestamps   "2026-06-20T08:14:10.123456789Z "
//   kubectl logs --prefix       "[pod/trainer-0/trainer] "
//   srun --label                "3: " (task id = SLURM_PROCID, right-aligned with spaces)
//   dmesg -x                    "kern  :err   : "
// The Kubernetes time is kept unless the program's own line carries one.
void ReadWrappers(Cursor& c, LineInfo& info) {
  for (bool more = true; more;) {
    more = false;
    size_t save = c.i;
    LineTime t;
    if (c.i < c.s.size() && IsDigit(c.s[c.i]) && c.s.size() - c.i > 20 && c.s[c.i + 10] == 'T' &&
        ReadIsoDateTime(c, t) && c.Eat(' ')) {
      // "<ts> host prog[pid]: ..." is a syslog line (journalctl -o short-iso), not a wrapper.
      Cursor peek = c;
      std::string_view host = peek.Token();
      peek.Spaces();
      std::string_view prog = peek.Token();
      if (!(host.size() > 0 && prog.size() > 1 && prog.back() == ':' &&
            host.find(':') == std::string_view::npos && host.front() != '[')) {
        info.time = t;
        more = true;
        continue;
      }
    }
    c.i = save;
    if (c.Eat("[pod/")) {
      size_t slash = c.s.find('/', c.i);
      size_t close = c.s.find("] ", c.i);
      if (close != std::string_view::npos && close - c.i < 260) {
        if (slash != std::string_view::npos && slash < close && info.host.empty())
          info.host = c.s.substr(c.i, slash - c.i);
        c.i = close + 2;
        more = true;
        continue;
      }
    }
    c.i = save;
    {
      c.Spaces();
      int64_t task;
      if (c.i - save < 8 && c.Num(&task) && task < 1000000 && c.Eat(": ")) {
        if (info.rank < 0) info.rank = static_cast<int>(task);
        more = true;
        continue;
      }
    }
    c.i = save;
    for (std::string_view fac : {"kern  :", "user  :", "daemon:", "syslog:"}) {
      if (c.Eat(fac)) {
        size_t colon = c.s.find(": ", c.i);
        if (colon != std::string_view::npos && colon - c.i <= 7) {
          c.i = colon + 2;
          more = true;
        } else {
          c.i = save;
        }
        break;
      }
    }
  }
}

}  // namespace

int64_t CivilToUnixUs(int y, int m, int d, int hh, int mm, int ss, int64_t micros) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const int64_t days = era * 146097 + doe - 719468;
  return ((days * 24 + hh) * 60 + mm) * 60 * 1000000 + ss * 1000000LL + micros;
}

int64_t NoYearToUnixUs(int year, int month, int day, int64_t us_of_day) {
  if (month < 1 || month > 12 || day < 1 || day > 31) return CivilToUnixUs(year, 1, 1, 0, 0, 0, 0);
  return CivilToUnixUs(year, month, day, 0, 0, 0, 0) + us_of_day;
}

std::string FormatTimeUs(int64_t us, bool with_date) {
  int64_t secs = us >= 0 ? us / 1000000 : (us - 999999) / 1000000;
  int64_t frac = us - secs * 1000000;
  int64_t days = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400;
  int64_t sod = secs - days * 86400;
  // civil-from-days
  int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t y = yoe + era * 400;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  if (m <= 2) ++y;
  std::string clock =
      fmt::format("{:02}:{:02}:{:02}.{:03}", sod / 3600, sod / 60 % 60, sod % 60, frac / 1000);
  if (!with_date) return clock;
  return fmt::format("{:04}-{:02}-{:02} {}", y, m, d, clock);
}

LineInfo ParseLine(std::string_view line) {
  LineInfo info;
  Cursor c{line};
  ReadWrappers(c, info);
  info.unwrapped = c.Rest();
  const LineTime wrapper_time = info.time;
  info.time = {};
  while (ReadRankPrefix(c, info)) {
  }
  const bool bracketed = c.i < line.size() && line[c.i] == '[';
  if (ReadTime(c, info)) {
    c.Spaces();
    if (c.Eat(']')) c.Spaces();
    // After a syslog time comes the host, then "kernel:" or "prog[pid]:".
    if (info.time.kind == LineTime::Kind::kNoYear && info.level == 0) {
      info.host = c.Token();
      c.Spaces();
    } else if (info.time.kind == LineTime::Kind::kAbsolute && !bracketed) {
      // RFC 3339 syslog (journalctl -o short-iso): "<ts> host kernel: ...".
      size_t save = c.i;
      std::string_view host = c.Token();
      c.Spaces();
      std::string_view prog = c.Token();
      if (!host.empty() && !prog.empty() && prog.back() == ':' && host.find(':') == host.npos &&
          host.front() != '[') {
        info.host = host;
        c.i = save + host.size();
        c.Spaces();
      } else {
        c.i = save;
      }
    }
    if (c.Eat("kernel: ")) {
      c.Spaces();
      Cursor k = c;
      int64_t v, v2;
      if (k.Eat('[')) {
        k.Spaces();
        if (k.Num(&v) && k.Eat('.') && k.Num(&v2, 6) && k.Eat(']')) {
          info.time.kernel_rel_us = v * 1000000 + v2;
          c = k;
          c.Spaces();
        }
      }
    }
    while (ReadRankPrefix(c, info)) {
    }
  }
  if (c.Eat("[kiln ")) {
    if (c.i < line.size()) info.level = line[c.i];
    size_t close = line.find(']', c.i);
    if (close != std::string_view::npos) c.i = close + 1;
    c.Spaces();
  }
  ReadNcclPrefix(c, info);
  info.body = c.Rest();
  ReadPgRank(info.body, info);
  if (info.time.kind == LineTime::Kind::kNone) info.time = wrapper_time;
  return info;
}

}  // namespace kiln::doctor
