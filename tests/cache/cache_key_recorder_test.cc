// cache::KeyRecorder: records the keys of GetOrCompile calls on its own thread, innermost recorder
// only, for hits, misses and uncached compiles alike.
#include <string>
#include <thread>
#include <vector>

#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

using testing::TempDir;
using testing::TestKey;
using testing::TestPayload;

std::string Get(KernelCache& cache, int seed) {
  absl::StatusOr<std::string> r = cache.GetOrCompile(
      TestKey(seed), [&]() -> absl::StatusOr<std::string> { return TestPayload(seed, 64); });
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : "";
}

std::vector<std::string> Names(const std::vector<CacheKey>& keys) {
  std::vector<std::string> names;
  for (const CacheKey& k : keys) names.push_back(k.EntryName());
  return names;
}

TEST(CacheKeyRecorderTest, RecordsEveryCallOnItsThreadInOrder) {
  TempDir dir;
  CacheOptions options;
  options.dir = dir.path();
  options.warn = [](std::string_view) {};
  KernelCache cache(options);
  Get(cache, 1);  // before any recorder: not recorded anywhere
  KeyRecorder recorder;
  Get(cache, 2);  // miss
  Get(cache, 1);  // disk hit
  EXPECT_EQ(Names(recorder.keys()),
            (std::vector<std::string>{TestKey(2).EntryName(), TestKey(1).EntryName()}));
  EXPECT_EQ(recorder.keys()[0], TestKey(2));  // the whole key, spec included

  std::thread other([&] { Get(cache, 3); });  // another thread's calls are not recorded
  other.join();
  EXPECT_EQ(recorder.keys().size(), 2u);
}

TEST(CacheKeyRecorderTest, InnermostRecorderOnlyAndOuterResumes) {
  CacheOptions options;
  options.disk_enabled = false;  // uncached compiles are recorded too
  KernelCache cache(options);
  KeyRecorder outer;
  Get(cache, 1);
  {
    KeyRecorder inner;
    Get(cache, 2);
    EXPECT_EQ(Names(inner.keys()), std::vector<std::string>{TestKey(2).EntryName()});
  }
  Get(cache, 3);
  EXPECT_EQ(Names(outer.keys()),
            (std::vector<std::string>{TestKey(1).EntryName(), TestKey(3).EntryName()}));
}

}  // namespace
}  // namespace fusejit::cache
