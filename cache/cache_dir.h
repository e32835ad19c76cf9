// cache/cache_dir.h (internal): the cache directory: where it is, whether it may be used, and
// every operation on its files. DirStore (cache/dir_store.h) is the Store built on it; the tiers
// above decide when to call what.
#ifndef FUSEJIT_CACHE_CACHE_DIR_H_
#define FUSEJIT_CACHE_CACHE_DIR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/cache_key.h"
#include "cache/env.h"
#include "cache/kernel_cache.h"

namespace fusejit::cache {

struct Counters {
  std::atomic<uint64_t> hits_memory{0}, hits_disk{0}, misses{0}, uncached{0}, coalesced{0},
      lock_waits{0}, compiles{0}, compile_failures{0}, compile_us{0}, bytes_read{0},
      bytes_written{0}, entries_written{0}, evictions{0}, evicted_bytes{0}, temp_files_swept{0},
      rejected_entries{0}, read_failures{0}, write_failures{0}, lock_failures{0};
  // The remote tier (cache/remote_tier.h).
  std::atomic<uint64_t> remote_hits{0}, remote_misses{0}, remote_rejected{0}, remote_published{0},
      remote_write_failures{0}, remote_errors{0}, remote_lock_waits{0}, remote_bytes_read{0},
      remote_bytes_written{0};
};

// Warns at most once per reason. Thread-safe.
class Warnings {
 public:
  explicit Warnings(std::function<void(std::string_view)> sink);
  void Warn(std::string_view reason, std::string_view message);

 private:
  std::function<void(std::string_view)> sink_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

struct ReadResult {
  enum class Outcome {
    kHit,      // payload holds the file
    kAbsent,   // no entry
    kCorrupt,  // an entry of ours that fails a check (too large): replace it
    kRefused,  // symlink, not a regular file, foreign owner, group/other-writable: leave it
    kError,    // I/O error reading it
  };
  Outcome outcome = Outcome::kAbsent;
  std::string payload;
  std::string problem;  // why, for every outcome but kHit and kAbsent (without the path)
  std::string reason;   // short tag for Warnings, e.g. "entry-symlink"
};

// A held (or not) per-key lock. Closing the descriptor releases the flock.
class KeyLock {
 public:
  KeyLock() = default;
  KeyLock(Env* env, int fd) : env_(env), fd_(fd) {}
  KeyLock(KeyLock&& other) noexcept : env_(other.env_), fd_(std::exchange(other.fd_, -1)) {}
  KeyLock& operator=(KeyLock&& other) noexcept;
  ~KeyLock() { Release(); }
  bool held() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Release();

 private:
  Env* env_ = nullptr;
  int fd_ = -1;
};

class CacheDir {
 public:
  CacheDir(const CacheOptions& options, Env* env, Counters* counters, Warnings* warnings);

  // Resolves, creates (0700) and checks the directory. Called once, before anything else.
  void Open();

  DiskState state() const { return state_; }
  const std::string& root() const { return root_; }
  const std::string& status_text() const { return status_text_; }
  // Usable and writes allowed (not read_only, not found read-only).
  bool writable() const { return state_ == DiskState::kUsable && !read_only_.load(); }

  std::string PathOf(std::string_view file_name) const;

  // The file's checks and read only (no decoding): on kHit, payload holds the whole file.
  ReadResult ReadRaw(const std::string& name);

  // One attempt at name's lock: a held lock, an unheld one while another process holds it, or
  // the failure ("cannot lock <path> (<why>)"; PermissionDenied when the directory was found
  // read-only, noted and warned about). Counts nothing.
  absl::StatusOr<KeyLock> TryLockKey(const std::string& name);

  // Deletes name's lock file while `lock` holds it (no other process can be using that file then:
  // a waiter that opened it re-checks the path after locking and starts over), then releases it.
  // Lock files thus last only while a key is being compiled. Failures only leave the file for
  // Trim's sweep.
  void ReleaseKey(KeyLock& lock, const std::string& name);

  // Writes bytes (an encoded entry) as name atomically. Faults are warned about (a permission
  // error also stops writes for good) and returned; a failed fsync of the directory after the
  // rename is warned about and counted in write_failures, and the entry counts as written.
  absl::Status PublishBytes(const std::string& name, std::string_view bytes);

  // Marks a disk hit as recent use (mtime); failures are ignored: they only age the entry.
  void Touch(const std::string& name);

  // Evicts least-recently-used entries down to 90% of max_bytes when over max_bytes; sweeps
  // temp files and unused lock files older than temp_max_age. Counts what it evicts and sweeps.
  absl::Status Trim();

  absl::StatusOr<size_t> Clear();
  absl::StatusOr<DiskUsage> Usage();

 private:
  void Refuse(DiskState state, std::string_view reason, std::string message);
  absl::Status MakeParents(const std::string& path);
  // Deletes name's lock file if no process holds it. Returns whether it was deleted.
  bool RemoveLockIfIdle(const std::string& entry_name);
  // Warns about a failed publish.
  void PublishFailed(const absl::Status& status, std::string_view step);
  // Stops writes for good (EROFS, EACCES, EPERM) and warns once.
  void NoteReadOnly(const absl::Status& status);
  absl::Status Usable() const;

  const CacheOptions& options_;
  Env* const env_;
  Counters* const counters_;
  Warnings* const warnings_;
  DiskState state_ = DiskState::kFailed;
  std::string root_;
  std::string status_text_ = "not opened";
  uint32_t uid_ = 0;
  std::atomic<bool> read_only_{false};
  std::atomic<uint64_t> temp_serial_{0};
  absl::Mutex trim_mu_;  // one Trim at a time in this process
};

// A temp file whose writer (the pid in its name) no longer exists on this host and that is older
// than this is deleted by the next Trim, instead of after temp_max_age.
inline constexpr absl::Duration kOrphanTempAge = absl::Seconds(30);

// File names the cache produces besides entries.
std::string LockFileName(std::string_view entry_name);  // "<32 hex>.lock"
bool IsLockFileName(std::string_view name);
bool IsTempFileName(std::string_view name);  // "<entry name>.tmp.<pid>.<serial>"

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_CACHE_DIR_H_
