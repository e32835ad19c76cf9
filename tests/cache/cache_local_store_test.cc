// KernelCache's disk tier works over any LocalStore (cache/local_store.h), not only the directory:
// an in-memory store beside DirStore gets hits, one compile per key, corrupt entries replaced,
// refused ones left alone, lock waits, maintenance (list, verify, clear, usage) and read-only
// mode, through the interface alone.
#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/local_store.h"
#include "cache/testing.h"
#include "gtest/gtest.h"

namespace fusejit::cache {
namespace {

using testing::TestKey;
using testing::TestPayload;
using testing::WarningLog;

// Entries in a map; locks are names held by a token. Thread-safe.
class MemoryStore final : public LocalStore {
 public:
  explicit MemoryStore(bool read_only = false) : read_only_(read_only) {}

  std::string Describe() const override { return "memory"; }
  absl::StatusOr<std::optional<std::string>> Get(std::string_view name) override {
    absl::MutexLock l(&mu_);
    ++gets_;
    const std::string n(name);
    if (refused_.count(n) > 0) {
      return WithStoreReason(absl::PermissionDeniedError("planted"), "entry-planted");
    }
    auto it = entries_.find(n);
    if (it == entries_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  absl::StatusOr<bool> Put(std::string_view name, std::string_view bytes, PutMode mode) override {
    absl::MutexLock l(&mu_);
    if (read_only_) return absl::PermissionDeniedError("read-only");
    auto [it, added] = entries_.try_emplace(std::string(name), bytes);
    if (!added && mode == PutMode::kIfAbsent) return false;
    it->second = std::string(bytes);
    ++puts_;
    return true;
  }
  absl::StatusOr<std::optional<std::string>> TryLock(std::string_view name,
                                                     absl::Duration) override {
    absl::MutexLock l(&mu_);
    if (!locks_.emplace(std::string(name)).second) return std::optional<std::string>();
    ++locks_taken_;
    return std::optional<std::string>(std::string(name));
  }
  absl::Status Unlock(std::string_view name, std::string_view token) override {
    absl::MutexLock l(&mu_);
    if (token == name) locks_.erase(std::string(name));
    return absl::OkStatus();
  }
  absl::Status UnlockAndDelete(std::string_view name, std::string_view token) override {
    return Unlock(name, token);
  }
  absl::StatusOr<std::vector<std::string>> List() override {
    absl::MutexLock l(&mu_);
    std::vector<std::string> names;
    for (const auto& [name, bytes] : entries_) names.push_back(name);
    return names;
  }
  absl::Status Remove(std::string_view name) override {
    absl::MutexLock l(&mu_);
    entries_.erase(std::string(name));
    return absl::OkStatus();
  }
  absl::StatusOr<StoreUsage> Usage() override {
    absl::MutexLock l(&mu_);
    StoreUsage u;
    for (const auto& [name, bytes] : entries_) {
      ++u.entries;
      u.entry_bytes += bytes.size();
    }
    return u;
  }
  absl::Status Ping() override { return absl::OkStatus(); }

  DiskState state() const override { return DiskState::kUsable; }
  std::string status_text() const override { return read_only_ ? "read-only" : "usable"; }
  std::string Locate(std::string_view name) const override { return "memory:" + std::string(name); }
  bool read_only() const override { return read_only_; }
  void Touch(std::string_view name) override {
    absl::MutexLock l(&mu_);
    ++touches_;
  }
  absl::StatusOr<EntryStat> Stat(std::string_view name) override {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(std::string(name));
    if (it == entries_.end()) return absl::NotFoundError(std::string(name));
    return EntryStat{it->second.size(), 0, 0};
  }
  absl::Status Trim() override { return absl::OkStatus(); }
  absl::StatusOr<size_t> Clear() override {
    absl::MutexLock l(&mu_);
    const size_t n = entries_.size();
    entries_.clear();
    return n;
  }

  // For the test.
  void Set(const std::string& name, std::string bytes) {
    absl::MutexLock l(&mu_);
    entries_[name] = std::move(bytes);
  }
  std::string At(const std::string& name) {
    absl::MutexLock l(&mu_);
    return entries_.count(name) > 0 ? entries_[name] : "";
  }
  void Refuse(const std::string& name) {
    absl::MutexLock l(&mu_);
    refused_.insert(name);
  }
  int puts() {
    absl::MutexLock l(&mu_);
    return puts_;
  }
  int touches() {
    absl::MutexLock l(&mu_);
    return touches_;
  }
  int locks_taken() {
    absl::MutexLock l(&mu_);
    return locks_taken_;
  }

 private:
  const bool read_only_;
  absl::Mutex mu_;
  std::map<std::string, std::string> entries_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> locks_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> refused_ ABSL_GUARDED_BY(mu_);
  int gets_ ABSL_GUARDED_BY(mu_) = 0;
  int puts_ ABSL_GUARDED_BY(mu_) = 0;
  int touches_ ABSL_GUARDED_BY(mu_) = 0;
  int locks_taken_ ABSL_GUARDED_BY(mu_) = 0;
};

class LocalStoreTest : public ::testing::Test {
 protected:
  CacheOptions Options(std::shared_ptr<MemoryStore> store) {
    CacheOptions o;
    o.dir = "/nonexistent/never/used";
    o.store = std::move(store);
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

  WarningLog log_;
  std::atomic<int> compiles_{0};
};

TEST_F(LocalStoreTest, MissPublishesAndHitsTouch) {
  auto store = std::make_shared<MemoryStore>();
  KernelCache cache(Options(store));
  EXPECT_TRUE(cache.disk_usable());
  EXPECT_EQ(cache.directory(), "memory");
  bool hit = true;
  EXPECT_EQ(Get(cache, 1, &hit), TestPayload(1, 100));
  EXPECT_FALSE(hit);
  EXPECT_EQ(store->At(TestKey(1).EntryName()), EncodeEntry(TestKey(1), TestPayload(1, 100)));
  EXPECT_EQ(store->locks_taken(), 1);
  EXPECT_EQ(Get(cache, 1, &hit), TestPayload(1, 100));
  EXPECT_TRUE(hit);
  EXPECT_EQ(compiles_, 1);
  EXPECT_EQ(store->touches(), 1);
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits_disk, 1u);
  EXPECT_EQ(s.entries_written, 1u);
  // Another cache on the same store (another "process") hits.
  KernelCache other(Options(store));
  EXPECT_EQ(Get(other, 1, &hit), TestPayload(1, 100));
  EXPECT_TRUE(hit);
  EXPECT_TRUE(log_.Lines().empty());
}

TEST_F(LocalStoreTest, OneCompilePerKeyAcrossThreads) {
  auto store = std::make_shared<MemoryStore>();
  KernelCache cache(Options(store));
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&] { Get(cache, 2); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(compiles_, 1);
  EXPECT_EQ(store->puts(), 1);
}

TEST_F(LocalStoreTest, CorruptEntryIsReplacedRefusedOneLeftAlone) {
  auto store = std::make_shared<MemoryStore>();
  const std::string good = EncodeEntry(TestKey(1), TestPayload(1, 100));
  store->Set(TestKey(1).EntryName(), good.substr(0, good.size() - 1));
  store->Refuse(TestKey(2).EntryName());
  KernelCache cache(Options(store));
  EXPECT_EQ(Get(cache, 1), TestPayload(1, 100));
  EXPECT_EQ(store->At(TestKey(1).EntryName()), good) << "not replaced";
  EXPECT_EQ(Get(cache, 2), TestPayload(2, 100));
  EXPECT_EQ(Get(cache, 2), TestPayload(2, 100));
  EXPECT_EQ(compiles_, 3) << "a refused entry is compiled each time, uncached";
  EXPECT_EQ(store->At(TestKey(2).EntryName()), "") << "a refused entry was written over";
  EXPECT_EQ(cache.Stats().rejected_entries, 3u);
  EXPECT_EQ(cache.Stats().uncached, 2u);
  EXPECT_EQ(log_.Count("recompiling and replacing"), 1);
  EXPECT_EQ(log_.Count("refusing cache entry memory:" + TestKey(2).EntryName() + ": planted"), 1);
}

TEST_F(LocalStoreTest, WaitsForAnotherHolderOfTheLock) {
  auto store = std::make_shared<MemoryStore>();
  const std::string name = TestKey(3).EntryName();
  absl::StatusOr<std::optional<std::string>> held = store->TryLock(name, absl::Seconds(1));
  ASSERT_TRUE(held.ok() && held->has_value());
  std::thread holder([&] {
    absl::SleepFor(absl::Milliseconds(50));
    store->Set(name, EncodeEntry(TestKey(3), TestPayload(3, 100)));
    ASSERT_TRUE(store->Unlock(name, **held).ok());
  });
  KernelCache cache(Options(store));
  bool hit = false;
  EXPECT_EQ(Get(cache, 3, &hit), TestPayload(3, 100));
  holder.join();
  EXPECT_TRUE(hit);
  EXPECT_EQ(compiles_, 0);
  EXPECT_EQ(cache.Stats().lock_waits, 1u);
}

TEST_F(LocalStoreTest, MaintenanceGoesThroughTheStore) {
  auto store = std::make_shared<MemoryStore>();
  KernelCache cache(Options(store));
  Get(cache, 1);
  Get(cache, 2);
  store->Set(TestKey(4).EntryName(), EncodeEntry(TestKey(5), "another key's"));
  absl::StatusOr<std::vector<EntryInfo>> list = cache.List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ(list->at(0).key.has_value() + list->at(1).key.has_value() + list->at(2).key.has_value(),
            2);
  absl::StatusOr<DiskUsage> usage = cache.Usage();
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->entries, 3u);
  absl::StatusOr<VerifyReport> v = cache.Verify(/*remove_bad=*/true);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->checked, 3u);
  EXPECT_EQ(v->ok, 2u);
  ASSERT_EQ(v->bad.size(), 1u);
  EXPECT_EQ(v->bad[0].first, TestKey(4).EntryName());
  EXPECT_EQ(v->removed, 1u);
  EXPECT_EQ(cache.Clear().value(), 2u);
  EXPECT_EQ(cache.Usage()->entries, 0u);
}

TEST_F(LocalStoreTest, ReadOnlyStoreServesHitsAndWritesNothing) {
  auto store = std::make_shared<MemoryStore>(/*read_only=*/true);
  store->Set(TestKey(1).EntryName(), EncodeEntry(TestKey(1), TestPayload(1, 100)));
  KernelCache cache(Options(store));
  bool hit = false;
  EXPECT_EQ(Get(cache, 1, &hit), TestPayload(1, 100));
  EXPECT_TRUE(hit);
  EXPECT_EQ(Get(cache, 2), TestPayload(2, 100));
  EXPECT_EQ(store->puts() + store->touches() + store->locks_taken(), 0);
  EXPECT_EQ(cache.Stats().write_failures, 0u);
  EXPECT_EQ(cache.Put(TestKey(3), "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.Verify(/*remove_bad=*/true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fusejit::cache
