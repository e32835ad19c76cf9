// cache/local_tier.h (internal): the disk tier of KernelCache: entries in a LocalStore
// (cache/local_store.h; the directory, cache/dir_store.h, unless CacheOptions::store), encoded
// and checked here (cache/entry_format.h), as the remote tier (cache/remote_tier.h) does with its
// Store.
//
// - Read: an entry that fails a check (the store's or the format's: truncated, corrupt, another
//   key's) is a miss, warned about once per reason, and replaced by the next publish; one the
//   store refuses (PermissionDenied: a symlink, another user's file) is a miss that is left alone
//   (*refused: compile uncached); an I/O error is a miss. A hit is touched (LRU).
// - Publish: whole entries replacing what is there; over max_bytes: warned about, not written.
// - Acquire: the key's lock in the store, polling with backoff while another process holds it.
//   A failure or a wait past the deadline is counted (lock_failures) and warned about; the
//   caller compiles without the lock.
// - Counts what each store call returns (hits_disk, bytes_read, rejected_entries, read_failures,
//   entries_written, bytes_written, write_failures, lock_failures); the store warns about its
//   own faults and counts what happens inside its calls (evictions, sweeps).
// - List, Verify, Clear, Usage, Trim: `fusejit cache list|verify|clear|stats`.
// Thread-safe.
#ifndef FUSEJIT_CACHE_LOCAL_TIER_H_
#define FUSEJIT_CACHE_LOCAL_TIER_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/cache_key.h"
#include "cache/kernel_cache.h"
#include "cache/local_store.h"

namespace fusejit::cache {

struct Counters;
class Warnings;

class LocalTier {
 public:
  // A held (or not) key lock; released (Store::Unlock) by its destructor or Release().
  // Release(/*delete_file=*/true): LocalStore::UnlockAndDelete, at the end of a compile.
  class Lock {
   public:
    Lock() = default;
    Lock(LocalStore* store, std::string name, std::string token)
        : store_(store), name_(std::move(name)), token_(std::move(token)) {}
    Lock(Lock&& o) noexcept { *this = std::move(o); }
    Lock& operator=(Lock&& o) noexcept;
    ~Lock() { Release(); }
    bool held() const { return store_ != nullptr; }
    void Release(bool delete_file = false);

   private:
    LocalStore* store_ = nullptr;
    std::string name_, token_;
  };

  // options: max_bytes (the largest entry written) and lock_timeout (the ttl of locks).
  LocalTier(std::shared_ptr<LocalStore> store, const CacheOptions& options, Counters* counters,
            Warnings* warnings);

  LocalStore& store() const { return *store_; }
  bool usable() const { return store_->state() == DiskState::kUsable; }
  bool writable() const { return usable() && !store_->read_only(); }

  // The payload of a valid entry for key (stored under name), if there is one. *refused: the
  // store refused what is there (leave it alone). count = false (polls): rejected entries and
  // read failures are warned about but not counted.
  std::optional<std::string> Read(const CacheKey& key, const std::string& name, bool* refused,
                                  bool count = true);

  // Publishes payload as key's entry, replacing what is there. Returns whether it was written
  // (not when read-only, over max_bytes or failed).
  bool Publish(const CacheKey& key, const std::string& name, std::string_view payload);

  // Takes name's lock, polling with backoff until it is held, until stop() returns true, until
  // deadline, or until locking fails. *waited: another holder was seen.
  Lock Acquire(const std::string& name, absl::Time deadline, absl::FunctionRef<bool()> stop,
               bool* waited);

  // Fail with FailedPrecondition when the store is not usable (nothing for kMissing).
  absl::StatusOr<std::vector<EntryInfo>> List();
  absl::StatusOr<VerifyReport> Verify(bool remove_bad);
  absl::StatusOr<size_t> Clear();
  absl::StatusOr<DiskUsage> Usage();
  absl::Status Trim();

 private:
  // FailedPrecondition naming the store and its state unless usable.
  absl::Status Usable() const;

  const std::shared_ptr<LocalStore> store_;
  const CacheOptions& options_;
  Counters* const counters_;
  Warnings* const warnings_;
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_LOCAL_TIER_H_
