// cache/dir_store.h: the Store (cache/store.h) on a directory, with the disk cache's protocol
// (cache/cache_dir.h): a private 0700 directory, symbolic links and foreign or
// group/other-writable files refused, atomic publish (temp file, fsync, rename). Locks are flock
// files: they lapse when their holder dies rather than after a TTL (ttl is not used); Trim sweeps
// unused ones. Keeps no fleet counters.
//
// Two uses: KernelCache's disk tier (the LocalStore additions, cache/local_store.h: LRU through
// mtime, eviction and sweeping in Trim, read-only mode), and a shared file system as the remote
// tier (RemoteOptions::store; tests of the remote tier without a Redis server).
//
// Get's failures: PermissionDenied for a refused entry (StoreReason "entry-symlink",
// "entry-not-regular", "entry-owner", "entry-permissions"), DataLoss for a file too large to be
// an entry ("entry-corrupt"), Unavailable for an I/O error ("read-error") and for an unusable
// directory. Write faults (full disk, read-only, I/O errors) are warned about once per reason
// and returned; a read-only directory is noted for good (read_only()).
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
#include "cache/local_store.h"

namespace fusejit::cache {

class DirStore final : public LocalStore {
 public:
  // A shared directory: created (0700) when missing; no size limit; warnings go to stderr.
  // env: nullptr: PosixEnv(); not owned.
  explicit DirStore(std::string dir, Env* env = nullptr);
  // The disk tier's: the directory, limit and modes of options (dir resolved from the
  // environment when empty; disk_enabled = false: kDisabled). Warns through `warnings` and
  // counts into `counters` (what Trim evicts and sweeps, failed directory fsyncs) when they are
  // not null. Opened (resolved, created, checked) here.
  DirStore(const CacheOptions& options, ::fusejit::cache::Counters* counters, Warnings* warnings);

  std::string Describe() const override { return dir_.root(); }
  absl::StatusOr<std::optional<std::string>> Get(std::string_view name) override;
  absl::StatusOr<bool> Put(std::string_view name, std::string_view bytes, PutMode mode) override;
  absl::StatusOr<std::optional<std::string>> TryLock(std::string_view name,
                                                     absl::Duration ttl) override;
  absl::Status Unlock(std::string_view name, std::string_view token) override;
  absl::Status UnlockAndDelete(std::string_view name, std::string_view token) override;
  absl::StatusOr<std::vector<std::string>> List() override;
  absl::Status Remove(std::string_view name) override;
  absl::StatusOr<StoreUsage> Usage() override;
  absl::Status Ping() override;

  DiskState state() const override { return dir_.state(); }
  std::string status_text() const override { return dir_.status_text(); }
  std::string Locate(std::string_view name) const override { return dir_.PathOf(name); }
  bool read_only() const override { return !dir_.writable(); }
  void Touch(std::string_view name) override { dir_.Touch(std::string(name)); }
  absl::StatusOr<EntryStat> Stat(std::string_view name) override;
  absl::Status Trim() override { return dir_.Trim(); }
  absl::StatusOr<size_t> Clear() override { return dir_.Clear(); }

 private:
  const CacheOptions options_;
  Env* const env_;
  ::fusejit::cache::Counters own_counters_;  // (Counters alone names Store::Counters here)
  Warnings own_warnings_{nullptr};
  CacheDir dir_;
  absl::Mutex mu_;
  uint64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  // Releases token's lock (deleting its file if delete_file); nothing when not ours.
  void Release(std::string_view name, std::string_view token, bool delete_file);

  absl::flat_hash_map<std::string, KeyLock> locks_ ABSL_GUARDED_BY(mu_);  // by token
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_DIR_STORE_H_
