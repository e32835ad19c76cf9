// `fusejit cache stats|list|verify|clear` (tools/cmd_cache.h).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "gtest/gtest.h"
#include "tools/cmd_cache.h"

namespace fusejit {
namespace {

using cache::testing::ListNames;
using cache::testing::ReadFileOrDie;
using cache::testing::TempDir;
using cache::testing::TestKey;
using cache::testing::TestPayload;
using cache::testing::WriteFileOrDie;

struct Output {
  int code;
  std::string out, err;
};

Output RunCli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = tools::RunCacheCommand(args, out, err);
  return {code, out.str(), err.str()};
}

class CacheCli : public ::testing::Test {
 protected:
  void Populate(int n) {
    cache::CacheOptions o;
    o.dir = root_;
    cache::KernelCache c(o);
    for (int seed = 0; seed < n; ++seed) {
      ASSERT_TRUE(c.GetOrCompile(TestKey(seed), [&] {
                     return absl::StatusOr<std::string>(TestPayload(seed, 1000));
                   }).ok());
    }
  }
  std::string EntryPath(int seed) { return root_ + "/" + TestKey(seed).EntryName(); }

  TempDir tmp_;
  std::string root_ = tmp_.Sub("cache");
};

TEST_F(CacheCli, HelpAndUsageErrors) {
  Output help = RunCli({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("usage: fusejit cache"), std::string::npos);
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{},
                                             {"frobnicate"},
                                             {"list", "--bogus"},
                                             {"list", "--cache-dir"},
                                             {"list", "--fix"},
                                             {"list", "extra"}}) {
    Output o = RunCli(bad);
    EXPECT_EQ(o.code, 2) << ::testing::PrintToString(bad);
    EXPECT_FALSE(o.err.empty()) << ::testing::PrintToString(bad);
  }
}

TEST_F(CacheCli, MissingDirectoryIsEmptyAndNotCreated) {
  Output stats = RunCli({"stats", "--cache-dir", root_});
  EXPECT_EQ(stats.code, 0) << stats.err;
  EXPECT_NE(stats.out.find("does not exist"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("entries       0"), std::string::npos) << stats.out;
  Output list = RunCli({"list", "--cache-dir=" + root_});
  EXPECT_EQ(list.code, 0);
  EXPECT_NE(list.out.find("0 entries"), std::string::npos) << list.out;
  EXPECT_FALSE(std::filesystem::exists(root_));
}

TEST_F(CacheCli, StatsAndListShowEntriesAndKeyFields) {
  Populate(3);
  Output stats = RunCli({"stats", "--cache-dir", root_});
  EXPECT_EQ(stats.code, 0) << stats.err;
  EXPECT_NE(stats.out.find("directory     " + root_), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("entries       3"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("1073741824 bytes"), std::string::npos) << stats.out;
  Output list = RunCli({"list", "--cache-dir", root_});
  EXPECT_EQ(list.code, 0) << list.err;
  for (int seed = 0; seed < 3; ++seed) {
    EXPECT_NE(list.out.find(TestKey(seed).EntryName().substr(0, 16)), std::string::npos);
    EXPECT_NE(list.out.find(TestKey(seed).spec), std::string::npos) << list.out;
  }
  EXPECT_NE(list.out.find("sm_90"), std::string::npos);
  EXPECT_NE(list.out.find(TestKey(0).options), std::string::npos);
  EXPECT_NE(list.out.find("3 entries"), std::string::npos) << list.out;
}

TEST_F(CacheCli, VerifyFindsCorruptEntriesAndFixRemovesThem) {
  Populate(3);
  Output ok = RunCli({"verify", "--cache-dir", root_});
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("3 ok, 0 bad"), std::string::npos) << ok.out;

  std::string bytes = ReadFileOrDie(EntryPath(1));
  bytes[bytes.size() / 2] ^= 0x10;
  WriteFileOrDie(EntryPath(1), bytes);
  Output bad = RunCli({"verify", "--cache-dir", root_});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("BAD " + TestKey(1).EntryName()), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("checksum"), std::string::npos) << bad.out;
  EXPECT_TRUE(std::filesystem::exists(EntryPath(1))) << "verify without --fix deleted";
  Output list = RunCli({"list", "--cache-dir", root_});
  EXPECT_NE(list.out.find("BAD"), std::string::npos) << list.out;

  Output fix = RunCli({"verify", "--fix", "--cache-dir", root_});
  EXPECT_EQ(fix.code, 0) << fix.out;
  EXPECT_NE(fix.out.find("1 removed"), std::string::npos) << fix.out;
  EXPECT_FALSE(std::filesystem::exists(EntryPath(1)));
  EXPECT_TRUE(std::filesystem::exists(EntryPath(0)));
}

TEST_F(CacheCli, ZeroMaxBytesIsReportedAsNoLimit) {
  Populate(2);
  const char* old = std::getenv("FUSEJIT_CACHE_MAX_BYTES");
  const std::string saved = old ? old : "";
  ::setenv("FUSEJIT_CACHE_MAX_BYTES", "0", 1);
  Output stats = RunCli({"stats", "--cache-dir", root_});
  if (old) {
    ::setenv("FUSEJIT_CACHE_MAX_BYTES", saved.c_str(), 1);
  } else {
    ::unsetenv("FUSEJIT_CACHE_MAX_BYTES");
  }
  EXPECT_EQ(stats.code, 0) << stats.err;
  EXPECT_NE(stats.out.find("limit         none"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("bytes, no limit)"), std::string::npos) << stats.out;
  EXPECT_EQ(stats.out.find("% of the limit"), std::string::npos) << stats.out;
}

TEST_F(CacheCli, RelativeCacheDirIsTheWorkingDirectorysNotRefused) {
  Populate(1);
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(tmp_.path());
  Output list = RunCli({"list", "--cache-dir", "cache"});
  std::filesystem::current_path(cwd);
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_NE(list.out.find("1 entries"), std::string::npos) << list.out;
}

TEST_F(CacheCli, ClearRemovesCacheFilesOnly) {
  Populate(3);
  WriteFileOrDie(root_ + "/notes.txt", "not the cache's");
  Output clear = RunCli({"clear", "--cache-dir", root_});
  EXPECT_EQ(clear.code, 0) << clear.err;
  // 3 entries; no lock files: they are deleted when their compile ends.
  EXPECT_NE(clear.out.find("removed 3 files"), std::string::npos) << clear.out;
  EXPECT_EQ(ListNames(root_), std::vector<std::string>{"notes.txt"});
  Output list = RunCli({"list", "--cache-dir", root_});
  EXPECT_NE(list.out.find("0 entries"), std::string::npos);
}

TEST_F(CacheCli, RefusedDirectoryIsAnError) {
  ASSERT_EQ(::mkdir(root_.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(root_.c_str(), 0777), 0);
  Output stats = RunCli({"stats", "--cache-dir", root_});
  EXPECT_EQ(stats.code, 1);
  EXPECT_NE(stats.err.find("writable by group or others"), std::string::npos) << stats.err;
  Output clear = RunCli({"clear", "--cache-dir", root_});
  EXPECT_EQ(clear.code, 1);
}

}  // namespace
}  // namespace fusejit
