// Files opened the way kiln promises (issue 17, "Hardening"): inputs are regular files, opened
// without blocking on a FIFO or device and read with a bound; outputs never replace a special
// file, a symbolic link or a file the same command reads; temporaries leave with the process.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/status.h"

namespace kiln {

// A file descriptor closed on every path out.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Where a file lives: two paths name the same file when both fields match.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
};

struct InputFile {
  UniqueFd fd;
  uint64_t size = 0;
  FileId id;
};

// Opens `path` for reading. O_NONBLOCK on the open, so a FIFO without a writer or a device
// cannot hang it; then fstat: anything but a regular file is KILN-E1009 (a missing file
// KILN-E1003). `what` names the file's role in messages ("model", "timing cache"). The file is
// remembered as an input of this process (see AtomicOutput).
StatusOr<InputFile> OpenInputFile(const std::string& path, std::string_view what);

// The whole of a regular file, at most `max_bytes` (KILN-E1010 past it, before reading).
StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                    uint64_t max_bytes);
// Reads `fd` from its current offset to the end or to `max_bytes`; KILN-E1010 if more is there.
StatusOr<std::string> ReadBounded(int fd, const std::string& path, std::string_view what,
                                  uint64_t max_bytes);

// OK when `path` may be written as an output: absent, or a regular file that is not a symbolic
// link. A FIFO, device, socket, directory or symbolic link is KILN-E1011.
Status CheckOutputPath(const std::string& path, std::string_view what);

// Where an output is really written: its directory resolved through every symbolic link
// (realpath), then its own name, which is never followed (CheckOutputPath refuses a link there).
// The rule for a symlinked directory in an output path (issue 17): it is resolved, not refused,
// and every check (kind of file, same file as an input) applies to the real path; AtomicOutput
// writes and renames in the resolved directory, so a link swapped in meanwhile cannot redirect
// the write. A directory that does not exist is KILN-E1003.
StatusOr<std::string> ResolveOutputPath(const std::string& path, std::string_view what);

// KILN-E1012 when `path` names a file that this process read as an input (while guarded, see
// GuardInputsOfThisProcess): for writers and removers that do not go through AtomicOutput (the
// engine cache publishing, evicting or discarding an entry). OK when the path does not exist.
Status CheckNotAnInput(const std::string& path, std::string_view what);

// The files one command reads and writes, checked once before any work: every output passes
// CheckOutputPath, inputs that exist are regular files (KILN-E1009), and no output is an input or
// another output (KILN-E1012; same device and inode, or, for outputs not yet there, the same
// directory and name). A file read and then rewritten by design (a timing cache) is InOut. After
// a successful Check every existing input counts as read by this process (see
// GuardInputsOfThisProcess), so that no writer replaces it, even before it is read.
class FileRoles {
 public:
  void Input(std::string path, std::string what);
  void Output(std::string path, std::string what);
  void InOut(std::string path, std::string what);
  Status Check() const;

 private:
  struct Role {
    std::string path, what;
    bool read = false, written = false;
  };
  std::vector<Role> roles_;
};

// An output written in full beside its final path and renamed over it on Commit: a reader sees
// the old file or the whole new one. The temporary `<path>.tmp.<pid>.<host>.<n>` is removed by the
// destructor, by SIGTERM/SIGINT (see InstallTempCleanup) and, if this process is killed, by the
// next AtomicOutput for the same path (its pid is then gone). Create refuses what
// CheckOutputPath refuses; Commit refuses (KILN-E1012) a path that is now a file this process
// read (see GuardInputsOfThisProcess), unless `replaces_input` (a cache rewritten after reading).
class AtomicOutput {
 public:
  struct Options {
    bool replaces_input = false;
    mode_t mode = 0644;
  };
  static StatusOr<AtomicOutput> Create(const std::string& path, std::string_view what);
  static StatusOr<AtomicOutput> Create(const std::string& path, std::string_view what,
                                       Options options);
  AtomicOutput(AtomicOutput&& o) noexcept;
  AtomicOutput& operator=(AtomicOutput&&) = delete;
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;
  ~AtomicOutput();

  int fd() const { return fd_.get(); }
  const std::string& temp_path() const { return tmp_; }
  // Appends `bytes` at the current offset; WriteAt writes at `offset`.
  Status Write(std::span<const std::byte> bytes);
  Status Write(std::string_view text) { return Write(std::as_bytes(std::span(text))); }
  Status WriteAt(std::span<const std::byte> bytes, uint64_t offset);
  // fsync, close, then rename over the final path.
  Status Commit();

 private:
  AtomicOutput(std::string path, std::string what, std::string tmp, UniqueFd fd, Options options,
               int slot);
  void Discard();
  std::string path_, what_, tmp_;
  UniqueFd fd_;
  Options options_;
  int slot_ = -1;  // in the signal handler's table
  bool done_ = false;
};

// Writes `data` to `path` through an AtomicOutput.
Status WriteFileAtomic(const std::string& path, std::string_view what, std::string_view data,
                       AtomicOutput::Options options = {});

// Installs (once) SIGTERM and SIGINT handlers that unlink every live temporary, then let the
// signal end the process as it would have (default action re-raised: the parent sees the signal,
// a shell reports 128+N). AtomicOutput::Create calls it; safe to call again.
void InstallTempCleanup();

// A temporary that a writer names and creates itself (the engine cache's), registered with the
// SIGTERM/SIGINT handler (InstallTempCleanup) from construction (before the file exists) until
// destruction or Release (after the rename): the handler unlinks it if a signal ends the process
// in between. Holds one of a fixed number of slots; past them the file is not registered.
class TempRegistration {
 public:
  explicit TempRegistration(const std::string& path);
  TempRegistration(const TempRegistration&) = delete;
  TempRegistration& operator=(const TempRegistration&) = delete;
  ~TempRegistration() { Release(); }
  void Release();
  bool registered() const { return slot_ >= 0; }

 private:
  int slot_ = -1;
};

// Removes `<path>.tmp.<pid>.<this host>.*` files whose pid no longer exists on this host, as a
// killed writer leaves them. Returns how many were removed.
int RemoveStaleTemporaries(const std::string& path);

// KILN-E1009..E1012: the path names the wrong kind of file for its role (a caller that would
// treat a bad cache as a warning must stop on these).
bool IsWrongFileKind(const Status& s);

// Makes this process remember every file OpenInputFile opens, so that no AtomicOutput replaces
// one (KILN-E1012) unless it says so. For processes that run one command (the `kiln` CLI): a
// long-lived process (Python) that loads an engine and later rewrites it leaves it off (default).
void GuardInputsOfThisProcess(bool on);

// Why others could plant files in the directory `st` describes, or an empty string when they
// cannot: owned by another user (root aside), or writable by its group or every user without the
// sticky bit. In a sticky directory writable by others (like /tmp) nobody can replace our files,
// and each file's owner is checked when it is read (FileDistrust).
std::string DirectoryDistrust(const struct stat& st);
// Why a file may not be trusted (owned by another user, root aside, or writable by its group or
// every user), or an empty string.
std::string FileDistrust(const struct stat& st);

// Whether this process opened the file `st` describes through OpenInputFile (while guarded).
// Compares device, inode and change time, so a file created later on a recycled inode is not taken
// for an input.
bool WasReadByThisProcess(const struct stat& st);

}  // namespace kiln
