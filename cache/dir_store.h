// cache/dir_store.h: the Store (cache/store.h) on a directory, with the disk cache's own
// protocol (cache/cache_dir.h): a private 0700 directory, symbolic links and foreign or
// group/other-writable files refused, atomic publish (temp file, fsync, rename). Locks are the
// disk cache's flock files: they lapse when their holder dies rather than after a TTL. Keeps no
// fleet counters. For a shared file system as the remote tier, and for tests of the remote tier
// without a Redis server (CacheOptions::remote with RemoteOptions::store).
//
// Thread-safe.
#ifndef FUSEJIT_CACHE_DIR_STORE_H_
#define FUSEJIT_CACHE_DIR_STORE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "cache/cache_dir.h"
#include "cache/store.h"

namespace fusejit::cache {

class DirStore final : public Store {
 public:
  // The directory is created (0700) when missing. env: nullptr: PosixEnv(); not owned.
  explicit DirStore(std::string dir, Env* env = nullptr);

  std::string Describe() const override { return dir_.root(); }
  absl::StatusOr<std::optional<std::string>> Get(std::string_view name) override;
  absl::StatusOr<bool> Put(std::string_view name, std::string_view bytes, PutMode mode) override;
  // ttl is not used: a flock lapses when its holder's process dies.
  absl::StatusOr<std::optional<std::string>> TryLock(std::string_view name,
                                                     absl::Duration ttl) override;
  absl::Status Unlock(std::string_view name, std::string_view token) override;
  absl::StatusOr<std::vector<std::string>> List() override;
  absl::Status Remove(std::string_view name) override;
  absl::StatusOr<StoreUsage> Usage() override;
  absl::Status Ping() override;

 private:
  const CacheOptions options_;
  Env* const env_;
  ::fusejit::cache::Counters counters_;  // (Counters alone names Store::Counters here)
  Warnings warnings_{nullptr};
  CacheDir dir_;
  absl::Mutex mu_;
  uint64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, KeyLock> locks_ ABSL_GUARDED_BY(mu_);  // by token
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_DIR_STORE_H_
