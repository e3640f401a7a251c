// Safe inputs, outputs and temporaries (file_io.h): the one place where kiln opens a user's files.
#include "kiln/core/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>

#include "kiln/core/logging.h"

namespace kiln {
namespace {

std::string_view KindOf(mode_t mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO (named pipe)";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISLNK(mode)) return "symbolic link";
  return "special file";
}

Status NotRegular(std::string_view what, const std::string& path, mode_t mode) {
  return MakeError(ErrorCode::kNotRegularFile,
                   "{} '{}' is a {}, not a regular file; kiln reads inputs only from regular files",
                   what, path, KindOf(mode));
}

Status OpenError(int err, std::string_view what, const std::string& path) {
  return MakeError(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
                   "cannot open {} '{}': {}", what, path, std::strerror(err));
}

// Files this process opened as inputs, so that no output replaces one of them. The change time
// tells the file read from a later one that got its inode after it was deleted.
struct ReadFile {
  FileId id;
  int64_t ctime_s = 0, ctime_ns = 0;
  bool operator==(const ReadFile&) const = default;
};
std::atomic<bool> g_guard_inputs{false};
std::mutex g_inputs_mu;
std::vector<ReadFile> g_inputs;

ReadFile ReadFileOf(const struct stat& st) {
  return {{st.st_dev, st.st_ino}, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

void RememberInput(const struct stat& st) {
  if (!g_guard_inputs.load()) return;
  const ReadFile r = ReadFileOf(st);
  std::lock_guard lock(g_inputs_mu);
  if (std::find(g_inputs.begin(), g_inputs.end(), r) == g_inputs.end()) g_inputs.push_back(r);
}

// ---- temporaries the signal handler removes ----------------------------------------------------
// A fixed table (no allocation, no lock) that an async signal handler may walk. A slot is free
// (0), being filled (1) or holds a live temporary's path (2).
constexpr int kTempSlots = 64;
constexpr size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0};
  char path[kTempPathMax];
};
std::array<TempSlot, kTempSlots> g_temps;

int RegisterTemp(const std::string& path) {
  if (path.size() >= kTempPathMax) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (g_temps[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
      g_temps[i].state.store(2);
      return i;
    }
  }
  return -1;  // more than kTempSlots writes at once: this one is not removed on a signal
}

void UnregisterTemp(int slot) {
  if (slot >= 0) g_temps[slot].state.store(0);
}

struct sigaction g_previous[2];
constexpr std::array<int, 2> kCleanupSignals = {SIGTERM, SIGINT};

void OnTerminatingSignal(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  for (TempSlot& s : g_temps) {
    if (s.state.load() == 2) ::unlink(s.path);
  }
  // Hand the signal on: to a handler that was there before (a host process's, e.g. Python's),
  // else its default action, which ends the process as the signal would have.
  const struct sigaction& prev = g_previous[sig == SIGTERM ? 0 : 1];
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  } else {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  errno = saved;
}

std::string HostTag() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  std::string h(host);
  for (char& c : h) {
    if (c == '/' || c < 0x21 || c > 0x7e) c = '_';
  }
  return h;
}

std::string Basename(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

std::string DirOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Who a path names, for comparing a command's files: the file itself when it exists, else the
// directory it would be created in plus its name.
struct PathIdentity {
  bool exists = false;
  FileId id;
  std::string name;  // for a path not yet there
  bool operator==(const PathIdentity&) const = default;
};

PathIdentity IdentityOf(const std::string& path) {
  PathIdentity p;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    p.exists = true;
    p.id = {st.st_dev, st.st_ino};
    return p;
  }
  struct stat dir {};
  if (::stat(DirOf(path).c_str(), &dir) == 0) {
    p.id = {dir.st_dev, dir.st_ino};
    p.name = Basename(path);
  } else {
    std::error_code ec;
    p.name = std::filesystem::absolute(path, ec).lexically_normal().string();
  }
  return p;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

bool IsWrongFileKind(const Status& s) {
  const ErrorCode c = s.code();
  return c == ErrorCode::kNotRegularFile || c == ErrorCode::kFileTooLarge ||
         c == ErrorCode::kOutputNotRegular || c == ErrorCode::kOutputOverwritesInput;
}

void GuardInputsOfThisProcess(bool on) {
  g_guard_inputs.store(on);
  if (!on) {
    std::lock_guard lock(g_inputs_mu);
    g_inputs.clear();
  }
}

std::string DirectoryDistrust(const struct stat& st) {
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return fmt::format("it is owned by another user (uid {})", st.st_uid);
  }
  if (st.st_mode & S_ISVTX) return {};
  if (st.st_mode & S_IWOTH) return "it is writable by every user (and not sticky)";
  if (st.st_mode & S_IWGRP) {
    return fmt::format("it is writable by group {} (and not sticky)", st.st_gid);
  }
  return {};
}

std::string FileDistrust(const struct stat& st) {
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return fmt::format("it is owned by another user (uid {})", st.st_uid);
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    return fmt::format("it is writable by {} (mode {:o})",
                       st.st_mode & S_IWOTH ? "every user" : "its group", st.st_mode & 07777);
  }
  return {};
}

bool WasReadByThisProcess(const struct stat& st) {
  const ReadFile r = ReadFileOf(st);
  std::lock_guard lock(g_inputs_mu);
  return std::find(g_inputs.begin(), g_inputs.end(), r) != g_inputs.end();
}

StatusOr<InputFile> OpenInputFile(const std::string& path, std::string_view what) {
  // stat first, so that a device is not even opened (opening some has side effects); the fstat
  // below is the check that counts (the path may change in between).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return OpenError(errno, what, path);
  if (!S_ISREG(st.st_mode)) return NotRegular(what, path, st.st_mode);
  int raw = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (raw < 0) return OpenError(errno, what, path);
  UniqueFd fd(raw);
  if (::fstat(fd.get(), &st) != 0) {
    return MakeError(ErrorCode::kIoError, "cannot stat {} '{}': {}", what, path,
                     std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return NotRegular(what, path, st.st_mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  InputFile f;
  f.fd = std::move(fd);
  f.size = static_cast<uint64_t>(st.st_size);
  f.id = {st.st_dev, st.st_ino};
  RememberInput(st);
  return f;
}

StatusOr<std::string> ReadBounded(int fd, const std::string& path, std::string_view what,
                                  uint64_t max_bytes) {
  std::string out;
  std::array<char, 1 << 16> chunk;
  for (;;) {
    ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return MakeError(ErrorCode::kIoError, "reading {} '{}' failed after {} bytes: {}", what, path,
                       out.size(), std::strerror(errno));
    }
    if (n == 0) return out;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      return MakeError(ErrorCode::kFileTooLarge,
                       "{} '{}' has more than {} bytes, the most kiln reads for a {}", what, path,
                       max_bytes, what);
    }
    out.append(chunk.data(), static_cast<size_t>(n));
  }
}

StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                    uint64_t max_bytes) {
  KILN_ASSIGN_OR_RETURN(InputFile f, OpenInputFile(path, what));
  if (f.size > max_bytes) {
    return MakeError(ErrorCode::kFileTooLarge,
                     "{} '{}' has {} bytes, more than the {} kiln reads for a {}", what, path,
                     f.size, max_bytes, what);
  }
  return ReadBounded(f.fd.get(), path, what, max_bytes);
}

Status CheckOutputPath(const std::string& path, std::string_view what) {
  if (path.empty()) return MakeError(ErrorCode::kInvalidArgument, "the {} path is empty", what);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return OkStatus();
    return MakeError(ErrorCode::kIoError, "cannot check {} '{}': {}", what, path,
                     std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(path, ec).string();
    return MakeError(ErrorCode::kOutputNotRegular,
                     "{} '{}' is a symbolic link (to '{}'); kiln does not replace links nor "
                     "write through them: name the target itself",
                     what, path, target);
  }
  if (!S_ISREG(st.st_mode)) {
    return MakeError(ErrorCode::kOutputNotRegular,
                     "{} '{}' is a {}; kiln writes outputs only as regular files", what, path,
                     KindOf(st.st_mode));
  }
  return OkStatus();
}

StatusOr<std::string> ResolveOutputPath(const std::string& path, std::string_view what) {
  if (path.empty()) return MakeError(ErrorCode::kInvalidArgument, "the {} path is empty", what);
  const std::string name = Basename(path);
  if (name.empty() || name == "." || name == "..") {
    return MakeError(ErrorCode::kOutputNotRegular,
                     "{} '{}' names a directory; kiln writes outputs only as regular files", what,
                     path);
  }
  const std::string dir = DirOf(path);
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(dir.c_str(), nullptr), &std::free);
  if (!real) {
    const int err = errno;
    return MakeError(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
                     "the directory '{}' of the {} '{}' cannot be used: {}", dir, what, path,
                     std::strerror(err));
  }
  const std::string real_dir(real.get());
  std::error_code ec;
  std::string lexical = std::filesystem::absolute(dir, ec).lexically_normal().string();
  while (lexical.size() > 1 && lexical.back() == '/') lexical.pop_back();
  if (!ec && lexical != real_dir) {
    // Said, not refused: the real path is what every check then looks at.
    struct stat st {};
    const bool named_link = ::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
    if (named_link) {
      KILN_LOG(Warn, CORE, "the {} '{}' is written in '{}': its directory '{}' is a symbolic link",
               what, path, real_dir, dir);
    } else {
      KILN_LOG(Info, CORE, "the {} '{}' is written in '{}' (its path goes through a symbolic link)",
               what, path, real_dir);
    }
  }
  return real_dir == "/" ? "/" + name : real_dir + "/" + name;
}

Status CheckNotAnInput(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return OkStatus();
  if (WasReadByThisProcess(st)) {
    return MakeError(ErrorCode::kOutputOverwritesInput,
                     "the {} '{}' is a file this command read as an input; kiln does not replace "
                     "nor remove it",
                     what, path);
  }
  return OkStatus();
}

void FileRoles::Input(std::string path, std::string what) {
  if (!path.empty()) roles_.push_back({std::move(path), std::move(what), true, false});
}
void FileRoles::Output(std::string path, std::string what) {
  if (!path.empty()) roles_.push_back({std::move(path), std::move(what), false, true});
}
void FileRoles::InOut(std::string path, std::string what) {
  if (!path.empty()) roles_.push_back({std::move(path), std::move(what), true, true});
}

Status FileRoles::Check() const {
  std::vector<PathIdentity> ids;
  for (const Role& r : roles_) {
    struct stat st {};
    if (r.read && ::stat(r.path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return NotRegular(r.what, r.path, st.st_mode);
    }
    if (r.written) KILN_RETURN_IF_ERROR(CheckOutputPath(r.path, r.what));
    ids.push_back(IdentityOf(r.path));
  }
  for (size_t i = 0; i < roles_.size(); ++i) {
    for (size_t j = i + 1; j < roles_.size(); ++j) {
      if (!roles_[i].written && !roles_[j].written) continue;  // two inputs may coincide
      if (!(ids[i] == ids[j])) continue;
      const Role& out = roles_[i].written ? roles_[i] : roles_[j];
      const Role& other = roles_[i].written ? roles_[j] : roles_[i];
      return MakeError(ErrorCode::kOutputOverwritesInput,
                       "the {} '{}' is the same file as the {} '{}'; writing it would destroy "
                       "the {}",
                       out.what, out.path, other.what, other.path, other.what);
    }
  }
  // Every input of the command counts as read from now on, also the ones read late or by a
  // library writer's own code (a calibration cache read mid-build): no writer of this process
  // (the engine cache's entries and heartbeats among them) may then replace one (CheckNotAnInput).
  for (const Role& r : roles_) {
    struct stat st {};
    if (r.read && ::stat(r.path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) RememberInput(st);
  }
  return OkStatus();
}

// ---- temporaries ------------------------------------------------------------------------------

void InstallTempCleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (size_t i = 0; i < kCleanupSignals.size(); ++i) {
      struct sigaction old {};
      if (::sigaction(kCleanupSignals[i], nullptr, &old) != 0) continue;
      if (old.sa_handler == SIG_IGN) continue;  // e.g. nohup: the signal stays ignored
      g_previous[i] = old;
      struct sigaction sa {};
      sa.sa_sigaction = OnTerminatingSignal;
      sigemptyset(&sa.sa_mask);
      for (int s : kCleanupSignals) sigaddset(&sa.sa_mask, s);
      sa.sa_flags = SA_SIGINFO;
      ::sigaction(kCleanupSignals[i], &sa, nullptr);
    }
  });
}

TempRegistration::TempRegistration(const std::string& path) {
  InstallTempCleanup();
  slot_ = RegisterTemp(path);
}

void TempRegistration::Release() {
  UnregisterTemp(slot_);
  slot_ = -1;
}

int RemoveStaleTemporaries(const std::string& path) {
  const std::string prefix = Basename(path) + ".tmp.";
  const std::string host = HostTag();
  const std::string dir = DirOf(path);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (!name.starts_with(prefix)) continue;
    std::string_view rest = name.substr(prefix.size());
    int64_t pid = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (ec != std::errc() || pid <= 0 || end == rest.data()) continue;
    rest.remove_prefix(static_cast<size_t>(end - rest.data()));
    if (!rest.starts_with(".") || !rest.substr(1).starts_with(host + ".")) continue;
    if (pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or unsure)
    const std::string full = dir + "/" + std::string(name);
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    if (::unlink(full.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

StatusOr<AtomicOutput> AtomicOutput::Create(const std::string& path, std::string_view what) {
  return Create(path, what, Options{});
}

StatusOr<AtomicOutput> AtomicOutput::Create(const std::string& path, std::string_view what,
                                            Options options) {
  KILN_RETURN_IF_ERROR(CheckOutputPath(path, what));
  // Written where the path really leads: the checks, the temporary and the rename all act on the
  // resolved directory (ResolveOutputPath).
  KILN_ASSIGN_OR_RETURN(const std::string real, ResolveOutputPath(path, what));
  KILN_RETURN_IF_ERROR(CheckOutputPath(real, what));
  RemoveStaleTemporaries(real);
  InstallTempCleanup();
  static std::atomic<uint64_t> counter{0};
  std::string tmp = fmt::format("{}.tmp.{}.{}.{}", real, ::getpid(), HostTag(), counter++);
  // Registered before it exists, so no signal can fall between its creation and its registration.
  const int slot = RegisterTemp(tmp);
  int raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
  if (raw < 0) {
    const int err = errno;
    UnregisterTemp(slot);
    return MakeError(ErrorCode::kIoError, "cannot create the {} '{}' (as '{}'): {}", what, path,
                     tmp, std::strerror(err));
  }
  return AtomicOutput(real, std::string(what), std::move(tmp), UniqueFd(raw), options, slot);
}

AtomicOutput::AtomicOutput(std::string path, std::string what, std::string tmp, UniqueFd fd,
                           Options options, int slot)
    : path_(std::move(path)),
      what_(std::move(what)),
      tmp_(std::move(tmp)),
      fd_(std::move(fd)),
      options_(options),
      slot_(slot) {}

AtomicOutput::AtomicOutput(AtomicOutput&& o) noexcept
    : path_(std::move(o.path_)),
      what_(std::move(o.what_)),
      tmp_(std::move(o.tmp_)),
      fd_(std::move(o.fd_)),
      options_(o.options_),
      slot_(std::exchange(o.slot_, -1)),
      done_(std::exchange(o.done_, true)) {}

AtomicOutput::~AtomicOutput() {
  if (!done_) Discard();
}

void AtomicOutput::Discard() {
  fd_ = UniqueFd();
  ::unlink(tmp_.c_str());
  UnregisterTemp(slot_);
  slot_ = -1;
  done_ = true;
}

Status AtomicOutput::WriteAt(std::span<const std::byte> bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n =
        ::pwrite(fd_.get(), bytes.data() + done, std::min<size_t>(bytes.size() - done, 1 << 30),
                 static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return MakeError(ErrorCode::kIoError, "writing the {} '{}' failed at byte {}: {}", what_,
                       tmp_, offset + done, std::strerror(n < 0 ? errno : EIO));
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

Status AtomicOutput::Write(std::span<const std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n =
        ::write(fd_.get(), bytes.data() + done, std::min<size_t>(bytes.size() - done, 1 << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return MakeError(ErrorCode::kIoError, "writing the {} '{}' failed: {}", what_, tmp_,
                       std::strerror(n < 0 ? errno : EIO));
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

Status AtomicOutput::Commit() {
  if (done_)
    return MakeError(ErrorCode::kInternal, "the {} '{}' was already committed", what_, path_);
  Status s;
  // Flushed before the rename, so a crash leaves either the old file or the complete new one.
  if (::fsync(fd_.get()) != 0 || ::close(fd_.release()) != 0) {
    s = MakeError(ErrorCode::kIoError, "flushing the {} '{}' failed: {}", what_, tmp_,
                  std::strerror(errno));
  }
  // The path may have changed since Create (another process, or a link made meanwhile).
  if (s.ok()) s = CheckOutputPath(path_, what_);
  struct stat st {};
  if (s.ok() && !options_.replaces_input && ::stat(path_.c_str(), &st) == 0 &&
      WasReadByThisProcess(st)) {
    s = MakeError(ErrorCode::kOutputOverwritesInput,
                  "the {} '{}' is a file this command read; writing it would destroy that input",
                  what_, path_);
  }
  if (s.ok() && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    s = MakeError(ErrorCode::kIoError, "renaming '{}' to the {} '{}' failed: {}", tmp_, what_,
                  path_, std::strerror(errno));
  }
  if (!s.ok()) {
    Discard();
    return s;
  }
  UnregisterTemp(slot_);
  slot_ = -1;
  done_ = true;
  return OkStatus();
}

Status WriteFileAtomic(const std::string& path, std::string_view what, std::string_view data,
                       AtomicOutput::Options options) {
  KILN_ASSIGN_OR_RETURN(AtomicOutput out, AtomicOutput::Create(path, what, options));
  KILN_RETURN_IF_ERROR(out.Write(data));
  return out.Commit();
}

}  // namespace kiln
