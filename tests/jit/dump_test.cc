// jit/dump.h: private dump folders, refused folders, writes that never follow links.
#include "jit/dump.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cache/testing.h"
#include "gtest/gtest.h"

namespace fusejit::jit {
namespace {

namespace fs = std::filesystem;
using cache::testing::TempDir;

std::string Read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Sets TMPDIR for the scope.
class ScopedTmpDir {
 public:
  explicit ScopedTmpDir(const std::string& dir) {
    if (const char* old = std::getenv("TMPDIR")) old_ = old;
    ::setenv("TMPDIR", dir.c_str(), 1);
  }
  ~ScopedTmpDir() {
    if (old_.empty()) {
      ::unsetenv("TMPDIR");
    } else {
      ::setenv("TMPDIR", old_.c_str(), 1);
    }
  }

 private:
  std::string old_;
};

TEST(Dump, FailedCompileFoldersArePrivateNewAndBounded) {
  TempDir tmp;
  ScopedTmpDir scoped(tmp.path());
  std::string first;
  for (size_t i = 0; i < kKeepDumps + 3; ++i) {
    absl::StatusOr<std::string> dir = NewPrivateDumpDir("failed");
    ASSERT_TRUE(dir.ok()) << dir.status();
    EXPECT_EQ(dir->rfind(tmp.path() + "/fusejit-failed.", 0), 0u) << *dir;
    struct stat st;
    ASSERT_EQ(::lstat(dir->c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    if (i == 0) {
      first = *dir;
    } else {
      EXPECT_NE(*dir, first);
    }
    // Distinct modification times, so that "newest" is well defined.
    fs::last_write_time(*dir, fs::file_time_type::clock::now() -
                                  std::chrono::seconds(100 * (kKeepDumps + 3 - i)));
  }
  size_t count = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    count += e.path().filename().string().rfind("fusejit-failed.", 0) == 0;
  }
  EXPECT_EQ(count, kKeepDumps);
  EXPECT_FALSE(fs::exists(first)) << "the oldest dump folder was kept";
}

TEST(Dump, WritesReplaceLinksAndNeverFollowThem) {
  TempDir tmp;
  const fs::path dir = tmp.Sub("dump");
  ASSERT_TRUE(PrepareDumpDir(dir.string()).ok());
  struct stat st;
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "a dump folder is created private";
  const fs::path victim = tmp.Sub("victim");
  { std::ofstream(victim) << "precious"; }
  fs::create_symlink(victim, dir / "k.cu");
  ASSERT_TRUE(WriteDumpFile(dir.string(), "k.cu", "source").ok());
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_EQ(Read(dir / "k.cu"), "source");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "k.cu")));
  ASSERT_TRUE(WriteDumpFile(dir.string(), "k.cu", "again").ok());  // an existing file: replaced
  EXPECT_EQ(Read(dir / "k.cu"), "again");
  EXPECT_FALSE(WriteDumpFile(dir.string(), "../escape.cu", "x").ok());
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
}

TEST(Dump, SharedLinkedAndForeignFoldersAreRefused) {
  TempDir tmp;
  const fs::path shared = tmp.Sub("shared");
  ASSERT_EQ(::mkdir(shared.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);  // like /tmp
  absl::Status s = PrepareDumpDir(shared.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(s.message()).find("writable by group or others (mode 1777)"),
            std::string::npos)
      << s;
  const fs::path link = tmp.Sub("link");
  fs::create_symlink(tmp.path(), link);
  s = PrepareDumpDir(link.string());
  EXPECT_NE(std::string(s.message()).find("is a symbolic link"), std::string::npos) << s;
  const fs::path file = tmp.Sub("file");
  { std::ofstream(file) << "x"; }
  s = PrepareDumpDir(file.string());
  EXPECT_NE(std::string(s.message()).find("is not a directory"), std::string::npos) << s;
  if (::geteuid() == 0) {  // only root can give a folder away
    const fs::path foreign = tmp.Sub("foreign");
    ASSERT_EQ(::mkdir(foreign.c_str(), 0700), 0);
    ASSERT_EQ(::chown(foreign.c_str(), 12345, 12345), 0);
    s = PrepareDumpDir(foreign.string());
    EXPECT_NE(std::string(s.message()).find("owned by uid 12345, not by this user"),
              std::string::npos)
        << s;
  }
}

}  // namespace
}  // namespace fusejit::jit
