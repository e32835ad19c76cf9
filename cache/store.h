// cache/store.h: a shared place for cache entries below the disk cache, behind one small interface:
// Redis (cache/redis_store.h) and, for tests and shared file systems, a directory
// (cache/dir_store.h). A Store keeps opaque bytes (whole encoded entries, cache/entry_format.h)
// under names that CacheKey::EntryName() produces; it neither encodes nor checks them: the remote
// tier above it (cache/remote_tier.h) does, exactly as the disk cache does.
//
// Thread safety: every method may be called from any thread at any time.
// Failures are statuses, never exceptions: Unavailable (unreachable, slow, disconnected, or
// skipped while a circuit breaker is open), PermissionDenied (authentication refused),
// ResourceExhausted (the store is full), others for protocol errors.
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
  uint64_t bytes = 0;
};

class Store {
 public:
  virtual ~Store() = default;

  // Where it is, for messages: "redis://host:6379/0" (never a password), a directory.
  virtual std::string Describe() const = 0;

  // The bytes stored under name; nullopt when there are none.
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

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_STORE_H_
