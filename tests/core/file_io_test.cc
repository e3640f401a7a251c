// Safe inputs, outputs and temporaries (core/file_io.h): special files refused without blocking,
// bounded reads, outputs that never replace links, devices or inputs, temporaries cleaned up.
#include "kiln/core/file_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln {
namespace {

namespace fs = std::filesystem;

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("kiln-file-io-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  void Put(const std::string& name, const std::string& text) const {
    std::ofstream(P(name), std::ios::binary) << text;
  }
  std::string Get(const std::string& name) const {
    std::ifstream f(P(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(FileIoTest, ReadsARegularFileWithinItsBound) {
  Put("a.txt", "hello");
  auto text = ReadInputFile(P("a.txt"), "test file", 5);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "hello");
  auto big = ReadInputFile(P("a.txt"), "test file", 4);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kFileTooLarge);
  EXPECT_NE(big.status().message().find("5 bytes"), std::string::npos) << big.status().message();
}

TEST_F(FileIoTest, MissingInputIsNotFound) {
  auto r = OpenInputFile(P("nope"), "model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
}

TEST_F(FileIoTest, FifoInputIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(P("fifo").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto r = OpenInputFile(P("fifo"), "model");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotRegularFile);
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().message();
}

TEST_F(FileIoTest, DevicesAndDirectoriesAreRefusedAsInputs) {
  auto full = ReadInputFile("/dev/full", "timing cache", 1 << 20);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), ErrorCode::kNotRegularFile);
  EXPECT_NE(full.status().message().find("character device"), std::string::npos);
  auto d = OpenInputFile(dir_.string(), "model");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kNotRegularFile);
}

TEST_F(FileIoTest, ReadBoundedStopsAtTheBoundOnAnEndlessStream) {
  int fd = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  UniqueFd keep(fd);
  auto r = ReadBounded(fd, "/dev/zero", "stream", 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kFileTooLarge);
}

TEST_F(FileIoTest, OutputChecksRefuseLinksAndSpecialFiles) {
  EXPECT_TRUE(CheckOutputPath(P("new.kiln"), "engine").ok());
  Put("old.kiln", "x");
  EXPECT_TRUE(CheckOutputPath(P("old.kiln"), "engine").ok());
  fs::create_symlink(P("old.kiln"), P("link.kiln"));
  Status link = CheckOutputPath(P("link.kiln"), "engine");
  EXPECT_EQ(link.code(), ErrorCode::kOutputNotRegular);
  EXPECT_NE(link.message().find("symbolic link"), std::string::npos);
  ASSERT_EQ(::mkfifo(P("fifo").c_str(), 0600), 0);
  EXPECT_EQ(CheckOutputPath(P("fifo"), "engine").code(), ErrorCode::kOutputNotRegular);
  EXPECT_EQ(CheckOutputPath("/dev/null", "engine").code(), ErrorCode::kOutputNotRegular);
  EXPECT_EQ(CheckOutputPath(dir_.string(), "engine").code(), ErrorCode::kOutputNotRegular);
}

TEST_F(FileIoTest, FileRolesRefuseAnOutputThatIsAnInput) {
  Put("model.onnx", "m");
  {
    FileRoles roles;
    roles.Input(P("model.onnx"), "model");
    roles.Output(P("model.onnx"), "engine");
    Status s = roles.Check();
    EXPECT_EQ(s.code(), ErrorCode::kOutputOverwritesInput);
    EXPECT_NE(s.message().find("model"), std::string::npos) << s.message();
  }
  {  // another spelling of the same path, and a hard link
    fs::create_hard_link(P("model.onnx"), P("hard.onnx"));
    FileRoles roles;
    roles.Input(P("model.onnx"), "model");
    roles.Output((dir_ / "." / "hard.onnx").string(), "report");
    EXPECT_EQ(roles.Check().code(), ErrorCode::kOutputOverwritesInput);
  }
  {  // two outputs that do not exist yet but are the same path
    FileRoles roles;
    roles.Output(P("out.kiln"), "engine");
    roles.Output((dir_ / "sub" / ".." / "out.kiln").string(), "report");
    fs::create_directories(dir_ / "sub");
    EXPECT_EQ(roles.Check().code(), ErrorCode::kOutputOverwritesInput);
  }
  {  // a timing cache read and written by design, an engine beside it: fine
    FileRoles roles;
    roles.Input(P("model.onnx"), "model");
    roles.InOut(P("cache.json"), "timing cache");
    roles.Output(P("out.kiln"), "engine");
    roles.Output("", "report");  // not given
    EXPECT_TRUE(roles.Check().ok()) << roles.Check().ToString();
  }
  {  // the engine on the timing cache
    FileRoles roles;
    roles.InOut(P("cache.json"), "timing cache");
    roles.Output(P("cache.json"), "engine");
    EXPECT_EQ(roles.Check().code(), ErrorCode::kOutputOverwritesInput);
  }
  {  // an input that is a device
    FileRoles roles;
    roles.InOut("/dev/full", "timing cache");
    EXPECT_EQ(roles.Check().code(), ErrorCode::kNotRegularFile);
    FileRoles out;
    out.Output("/dev/full", "report");
    EXPECT_EQ(out.Check().code(), ErrorCode::kOutputNotRegular);
    FileRoles in;
    in.Input("/dev/zero", "model");
    EXPECT_EQ(in.Check().code(), ErrorCode::kNotRegularFile);
  }
}

TEST_F(FileIoTest, AtomicOutputReplacesOnlyOnCommit) {
  Put("out.txt", "old");
  {
    auto out = AtomicOutput::Create(P("out.txt"), "test output");
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_TRUE(out->Write(std::string_view("new!")).ok());
    EXPECT_EQ(Get("out.txt"), "old");
    EXPECT_EQ(Names().size(), 2u);  // the file and its temporary
  }                                 // dropped without Commit
  EXPECT_EQ(Get("out.txt"), "old");
  EXPECT_EQ(Names(), std::vector<std::string>{"out.txt"});
  Status s = WriteFileAtomic(P("out.txt"), "test output", "new!");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Get("out.txt"), "new!");
  EXPECT_EQ(Names(), std::vector<std::string>{"out.txt"});
}

TEST_F(FileIoTest, AtomicOutputRefusesSpecialFilesAndLinks) {
  ASSERT_EQ(::mkfifo(P("fifo").c_str(), 0600), 0);
  EXPECT_EQ(WriteFileAtomic(P("fifo"), "engine", "x").code(), ErrorCode::kOutputNotRegular);
  Put("target", "keep");
  fs::create_symlink(P("target"), P("link"));
  EXPECT_EQ(WriteFileAtomic(P("link"), "engine", "x").code(), ErrorCode::kOutputNotRegular);
  EXPECT_EQ(Get("target"), "keep");
  EXPECT_TRUE(fs::is_symlink(P("link")));
  EXPECT_EQ(Names(), (std::vector<std::string>{"fifo", "link", "target"}));
}

TEST_F(FileIoTest, AtomicOutputRefusesAFileThisProcessRead) {
  Put("in.json", "data");
  // Unguarded (a long-lived process): reading does not make a file unwritable.
  ASSERT_TRUE(ReadInputFile(P("in.json"), "input", 100).ok());
  ASSERT_TRUE(WriteFileAtomic(P("in.json"), "report", "data").ok());
  GuardInputsOfThisProcess(true);  // as the CLI runs
  ASSERT_TRUE(ReadInputFile(P("in.json"), "input", 100).ok());
  Status s = WriteFileAtomic(P("in.json"), "report", "x");
  EXPECT_EQ(s.code(), ErrorCode::kOutputOverwritesInput);
  EXPECT_EQ(Get("in.json"), "data");
  AtomicOutput::Options rewrite;
  rewrite.replaces_input = true;  // a cache rewritten after reading it
  EXPECT_TRUE(WriteFileAtomic(P("in.json"), "cache", "y", rewrite).ok());
  EXPECT_EQ(Get("in.json"), "y");
  EXPECT_EQ(Names(), std::vector<std::string>{"in.json"});
  GuardInputsOfThisProcess(false);
}

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

TEST_F(FileIoTest, StaleTemporariesOfDeadProcessesAreRemoved) {
  // A child that exits: its pid is then free (not reused this fast in practice).
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const std::string host = HostName();
  Put(fmt::format("out.kiln.tmp.{}.{}.0", child, host), "stale");
  Put(fmt::format("out.kiln.tmp.{}.{}.0", ::getppid(), host), "alive");  // the parent lives
  Put(fmt::format("out.kiln.tmp.{}.otherhost.0", child), "other host");
  Put(fmt::format("other.kiln.tmp.{}.{}.0", child, host), "another output");
  ASSERT_TRUE(WriteFileAtomic(P("out.kiln"), "engine", "e").ok());
  std::vector<std::string> kept = {fmt::format("other.kiln.tmp.{}.{}.0", child, host), "out.kiln",
                                   fmt::format("out.kiln.tmp.{}.otherhost.0", child),
                                   fmt::format("out.kiln.tmp.{}.{}.0", ::getppid(), host)};
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(Names(), kept);
}

TEST_F(FileIoTest, SigtermRemovesLiveTemporariesAndStillTerminates) {
  const std::string out = P("out.kiln");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    auto o = AtomicOutput::Create(out, "engine");
    if (!o.ok()) ::_exit(3);
    (void)o->Write(std::string_view("partial"));
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(Names().size(), 1u);  // the temporary
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_TRUE(Names().empty());
}

// A symbolic link in an output's directory is resolved, and every check applies to the real path
// (issue 17's rule): the write lands where the link leads, never over an input or a device there.
TEST_F(FileIoTest, SymlinkedOutputDirectoryIsResolvedAndCheckedThere) {
  fs::create_directories(dir_ / "real");
  fs::create_directory_symlink(dir_ / "real", dir_ / "via");
  StatusOr<std::string> r = ResolveOutputPath(P("via/out.kiln"), "engine");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, fs::canonical(dir_ / "real").string() + "/out.kiln");
  ASSERT_TRUE(WriteFileAtomic(P("via/out.kiln"), "engine", "e").ok());
  EXPECT_EQ(Get("real/out.kiln"), "e");
  EXPECT_TRUE(fs::is_symlink(dir_ / "via"));

  // The model seen through the link is the model.
  Put("real/model.onnx", "model");
  FileRoles roles;
  roles.Input(P("real/model.onnx"), "model");
  roles.Output(P("via/model.onnx"), "engine");
  EXPECT_EQ(roles.Check().code(), ErrorCode::kOutputOverwritesInput);
  GuardInputsOfThisProcess(true);
  ASSERT_TRUE(ReadInputFile(P("real/model.onnx"), "model", 100).ok());
  EXPECT_EQ(WriteFileAtomic(P("via/model.onnx"), "engine", "x").code(),
            ErrorCode::kOutputOverwritesInput);
  GuardInputsOfThisProcess(false);
  EXPECT_EQ(Get("real/model.onnx"), "model");

  // A directory link to /dev: the device behind it is refused, never replaced.
  fs::create_directory_symlink("/dev", dir_ / "devlink");
  EXPECT_EQ(WriteFileAtomic(P("devlink/null"), "engine", "x").code(), ErrorCode::kOutputNotRegular);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  // A missing directory, and a path that names a directory.
  EXPECT_EQ(ResolveOutputPath(P("nowhere/out.kiln"), "engine").status().code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(ResolveOutputPath(P("real/"), "engine").status().code(), ErrorCode::kOutputNotRegular);
  EXPECT_EQ(ResolveOutputPath(P("real/.."), "engine").status().code(),
            ErrorCode::kOutputNotRegular);
}

// Declared inputs count as read once FileRoles::Check passed, before anything reads them.
TEST_F(FileIoTest, FileRolesInputsAreGuardedBeforeTheyAreRead) {
  Put("calib.json", "cache");
  GuardInputsOfThisProcess(true);
  FileRoles roles;
  roles.InOut(P("calib.json"), "calibration cache");
  roles.Output(P("out.kiln"), "engine");
  ASSERT_TRUE(roles.Check().ok());
  EXPECT_EQ(CheckNotAnInput(P("calib.json"), "heartbeat").code(),
            ErrorCode::kOutputOverwritesInput);
  EXPECT_TRUE(CheckNotAnInput(P("out.kiln"), "heartbeat").ok());
  EXPECT_EQ(WriteFileAtomic(P("calib.json"), "engine", "x").code(),
            ErrorCode::kOutputOverwritesInput);
  GuardInputsOfThisProcess(false);
  EXPECT_EQ(Get("calib.json"), "cache");
}

// A writer's own temporary (the engine cache's) registered with TempRegistration leaves with the
// process on SIGTERM, as AtomicOutput's do.
TEST_F(FileIoTest, RegisteredTemporariesAreRemovedOnSigterm) {
  const std::string tmp = P(".entry.engine.tmp.x");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    TempRegistration reg(tmp);
    if (!reg.registered()) ::_exit(3);
    std::ofstream(tmp) << "partial";
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_TRUE(fs::exists(tmp));
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(fs::exists(tmp));
  // Released (after its rename, say): the name is the writer's again and stays.
  {
    TempRegistration reg(P("kept"));
    reg.Release();
  }
  Put("kept", "k");
  EXPECT_EQ(Get("kept"), "k");
}

}  // namespace
}  // namespace kiln
