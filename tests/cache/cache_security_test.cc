// Permission safety: the directory is created 0700; a cache directory or entry that is a symbolic
// link, owned by another user, or writable by group/others is refused with one warning, and the
// run goes on uncached (a planted entry is never loaded, never written through).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/time/clock.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

using testing::ListNames;
using testing::ReadFileOrDie;
using testing::TempDir;
using testing::TestKey;
using testing::TestPayload;
using testing::WarningLog;
using testing::WriteFileOrDie;

constexpr uid_t kOtherUid = 12345;

class CacheSecurity : public ::testing::Test {
 protected:
  CacheOptions Options(const std::string& dir) {
    CacheOptions o;
    o.dir = dir;
    o.warn = log_.Sink();
    return o;
  }
  std::string Get(KernelCache& cache, int seed, bool* hit = nullptr) {
    absl::StatusOr<std::string> r = cache.GetOrCompile(
        TestKey(seed),
        [&] {
          ++compiles_;
          return absl::StatusOr<std::string>(TestPayload(seed, 100));
        },
        hit);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }
  // A valid-looking entry for seed whose payload is not what compiling gives: if it is ever
  // returned, the refusal failed.
  static std::string EvilEntry(int seed) { return EncodeEntry(TestKey(seed), "EVIL CUBIN"); }

  // A cache directory refused for `why`: two kernels compiled, nothing written, one warning.
  void ExpectRootRefused(const std::string& root, const std::string& why) {
    KernelCache cache(Options(root));
    EXPECT_EQ(Get(cache, 1), TestPayload(1, 100));
    EXPECT_EQ(Get(cache, 2), TestPayload(2, 100));
    EXPECT_EQ(compiles_, 2);
    EXPECT_EQ(cache.disk_state(), DiskState::kRefused) << cache.disk_status();
    EXPECT_EQ(log_.Lines().size(), 1u) << ::testing::PrintToString(log_.Lines());
    EXPECT_EQ(log_.Count(why), 1) << ::testing::PrintToString(log_.Lines());
    EXPECT_EQ(cache.Stats().uncached, 2u);
  }

  // An entry of the cache for seed 1 refused for `why`: compiled (twice: it is not replaced),
  // the planted file left exactly as it was, one warning.
  void ExpectEntryRefused(const std::string& why) {
    const std::string path = root_ + "/" + TestKey(1).EntryName();
    struct stat before;
    ASSERT_EQ(::lstat(path.c_str(), &before), 0);
    KernelCache cache(Options(root_));
    bool hit = true;
    EXPECT_EQ(Get(cache, 1, &hit), TestPayload(1, 100));
    EXPECT_FALSE(hit);
    EXPECT_EQ(Get(cache, 1), TestPayload(1, 100));
    EXPECT_EQ(compiles_, 2);
    EXPECT_EQ(cache.Stats().rejected_entries, 2u);
    EXPECT_EQ(log_.Lines().size(), 1u) << ::testing::PrintToString(log_.Lines());
    EXPECT_EQ(log_.Count(why), 1) << ::testing::PrintToString(log_.Lines());
    struct stat after;
    ASSERT_EQ(::lstat(path.c_str(), &after), 0);
    EXPECT_EQ(after.st_ino, before.st_ino) << "the refused entry was replaced";
    EXPECT_EQ(after.st_mode, before.st_mode);
    // Other kernels are still cached.
    EXPECT_EQ(Get(cache, 2), TestPayload(2, 100));
    EXPECT_TRUE(std::filesystem::exists(root_ + "/" + TestKey(2).EntryName()));
    // verify reports it.
    absl::StatusOr<VerifyReport> v = cache.Verify(false);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(v->bad.size(), 1u);
    EXPECT_EQ(v->bad[0].first, TestKey(1).EntryName());
  }

  void MakeRoot() { ASSERT_EQ(::mkdir(root_.c_str(), 0700), 0); }

  TempDir tmp_;
  std::string root_ = tmp_.Sub("cache");
  WarningLog log_;
  int compiles_ = 0;
};

TEST_F(CacheSecurity, DirectoryIsCreatedPrivateWhateverTheUmask) {
  const mode_t old = ::umask(0);
  KernelCache cache(Options(root_));
  Get(cache, 1);
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::lstat(root_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::lstat((root_ + "/" + TestKey(1).EntryName()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(CacheSecurity, RootThatIsASymlinkIsRefused) {
  const std::string target = tmp_.Sub("elsewhere");
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(target.c_str(), root_.c_str()), 0);
  ExpectRootRefused(root_, "symbolic link");
  EXPECT_TRUE(ListNames(target).empty()) << "wrote through the symlink";
}

TEST_F(CacheSecurity, RootWritableByGroupIsRefused) {
  MakeRoot();
  ASSERT_EQ(::chmod(root_.c_str(), 0770), 0);
  ExpectRootRefused(root_, "writable by group or others");
  EXPECT_TRUE(ListNames(root_).empty());
}

TEST_F(CacheSecurity, RootWritableByOthersIsRefused) {
  MakeRoot();
  ASSERT_EQ(::chmod(root_.c_str(), 0703), 0);
  ExpectRootRefused(root_, "writable by group or others");
}

TEST_F(CacheSecurity, RootThatIsAFileIsRefused) {
  WriteFileOrDie(root_, "not a directory");
  ExpectRootRefused(root_, "not a directory");
}

TEST_F(CacheSecurity, RootOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to uid " << kOtherUid;
  MakeRoot();
  ASSERT_EQ(::chown(root_.c_str(), kOtherUid, kOtherUid), 0);
  ExpectRootRefused(root_, "owned by uid 12345");
  EXPECT_TRUE(ListNames(root_).empty());
}

TEST_F(CacheSecurity, EntryThatIsASymlinkIsRefusedAndLeftAlone) {
  MakeRoot();
  const std::string target = tmp_.Sub("planted");
  WriteFileOrDie(target, EvilEntry(1));
  ASSERT_EQ(::symlink(target.c_str(), (root_ + "/" + TestKey(1).EntryName()).c_str()), 0);
  ExpectEntryRefused("symbolic link");
  EXPECT_EQ(ReadFileOrDie(target), EvilEntry(1)) << "wrote through the symlink";
}

TEST_F(CacheSecurity, EntryWritableByGroupIsRefused) {
  MakeRoot();
  WriteFileOrDie(root_ + "/" + TestKey(1).EntryName(), EvilEntry(1), 0660);
  ExpectEntryRefused("writable by group or others");
}

TEST_F(CacheSecurity, EntryWritableByOthersIsRefused) {
  MakeRoot();
  WriteFileOrDie(root_ + "/" + TestKey(1).EntryName(), EvilEntry(1), 0602);
  ExpectEntryRefused("writable by group or others");
}

TEST_F(CacheSecurity, EntryOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to uid " << kOtherUid;
  MakeRoot();
  const std::string path = root_ + "/" + TestKey(1).EntryName();
  WriteFileOrDie(path, EvilEntry(1), 0600);
  ASSERT_EQ(::chown(path.c_str(), kOtherUid, kOtherUid), 0);
  ExpectEntryRefused("owned by uid 12345");
}

TEST_F(CacheSecurity, FifoEntryIsRefusedWithoutBlocking) {
  MakeRoot();
  ASSERT_EQ(::mkfifo((root_ + "/" + TestKey(1).EntryName()).c_str(), 0600), 0);
  const absl::Time start = absl::Now();
  ExpectEntryRefused("not a regular file");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(CacheSecurity, ControlCaseAnOwnPrivateEntryIsUsed) {
  // The refusals above are not refusals of everything: the same planted bytes with mode 0600,
  // owned by us, are a valid entry and are loaded.
  MakeRoot();
  WriteFileOrDie(root_ + "/" + TestKey(1).EntryName(), EvilEntry(1), 0600);
  KernelCache cache(Options(root_));
  absl::StatusOr<std::string> r =
      cache.GetOrCompile(TestKey(1), [] { return absl::StatusOr<std::string>("compiled"); });
  EXPECT_EQ(r.value(), "EVIL CUBIN");
}

}  // namespace
}  // namespace fusejit::cache
