// cache/store.h: a place for cache entries behind one small interface: the remote tier's Redis
// (cache/redis_store.h) and the directory (cache/dir_store.h), which is also the disk tier's
// (through the LocalStore additions, cache/local_store.h). A Store keeps opaque bytes (whole
// encoded entries, cache/entry_format.h) under names that CacheKey::EntryName() produces; it
// neither encodes nor decodes them: the tier above it does (cache/local_tier.h,
// cache/remote_tier.h), the same way for every store.
//
// Thread safety: every method may be called from any thread at any time.
// Failures are statuses, never exceptions: Unavailable (unreachable, slow, disconnected, skipped
// while a circuit breaker is open; an I/O error), PermissionDenied (authentication refused; an
// entry or a write refused, see Get and LocalStore), ResourceExhausted (the store is full), others
// for protocol errors. A store warns about its own faults itself (once per reason, through the
// sink its constructor takes); the tier above counts the failures it is returned.
#ifndef FUSEJIT_CACHE_STORE_H_
#define FUSEJIT_CACHE_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fusejit::cache {

struct StoreUsage {
  size_t entries = 0;
  uint64_t entry_bytes = 0;
  // What a store that keeps files leaves besides entries (cache/local_store.h); 0 elsewhere.
  size_t temp_files = 0;
  uint64_t temp_bytes = 0;
  size_t lock_files = 0;
};
// The disk tier's name for it (KernelCache::Usage, `fusejit cache stats`).
using DiskUsage = StoreUsage;

class Store {
 public:
  virtual ~Store() = default;

  // Where it is, for messages: "redis://host:6379/0" (never a password), a directory.
  virtual std::string Describe() const = 0;

  // The bytes stored under name; nullopt when there are none. Besides the failures above, a store
  // that checks what it holds (a directory: cache/dir_store.h) fails with
  //   DataLoss: what is there fails the store's own checks (too large to be an entry): a caller
  //     may replace it (Put with kReplace);
  //   PermissionDenied: what is there is refused (a symbolic link, another user's file): the
  //     caller must leave it alone, never overwrite it;
  // with a message saying what is wrong (not where: see LocalStore::Locate) and a StoreReason.
  virtual absl::StatusOr<std::optional<std::string>> Get(std::string_view name) = 0;

  enum class PutMode { kIfAbsent, kReplace };
  // Stores bytes under name, whole or not at all. Returns false when mode is kIfAbsent and a
  // value is already there (left unchanged), true when written.
  virtual absl::StatusOr<bool> Put(std::string_view name, std::string_view bytes,
                                   PutMode mode) = 0;

  // One attempt to take name's compile lock for `ttl` (after which it lapses by itself, so a
  // holder that dies blocks nobody for longer). Returns the owner token to Unlock with, or
  // nullopt while someone else holds it. Never waits for the holder.
  virtual absl::StatusOr<std::optional<std::string>> TryLock(std::string_view name,
                                                             absl::Duration ttl) = 0;
  // Releases name's lock if `token` still owns it; a lapsed or re-taken lock is left alone.
  virtual absl::Status Unlock(std::string_view name, std::string_view token) = 0;

  // Names of every entry (not locks or other keys), in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> List() = 0;
  virtual absl::Status Remove(std::string_view name) = 0;
  virtual absl::StatusOr<StoreUsage> Usage() = 0;

  // Whether the store answers now (one round trip; opens a connection if need be).
  virtual absl::Status Ping() = 0;

  // Fleet-wide counters kept in the store (hits, misses, rejected, ...): Count adds one; Counters
  // reads them all. Optional: the default keeps none.
  virtual void Count(std::string_view counter) {}
  virtual absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> Counters() {
    return std::vector<std::pair<std::string, int64_t>>{};
  }
};

// A short tag for a failure a store returns, for warning once per reason ("entry-symlink",
// "read-error"); `fallback` when the store attached none.
std::string StoreReason(const absl::Status& status, std::string_view fallback);
// status with `reason` attached for StoreReason().
absl::Status WithStoreReason(absl::Status status, std::string_view reason);

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_STORE_H_
