// cache/kernel_cache.h: the disk kernel cache. Opaque payloads (cubins) stored one file per key
// below a private directory, shared safely by any number of threads and processes.
//
//   fusejit::cache::CacheKey key{.source_hash = HashSource(src, headers), ...};
//   absl::StatusOr<std::string> cubin = KernelCache::Default().GetOrCompile(key, [&] {
//     return CompileWithNvrtc(src);
//   });
//
// Promises (../shared/CACHE.md):
// - Atomic publish: temp file in the cache directory, write, fsync, close, rename, fsync the
//   directory; every result checked. Readers take no lock and see a whole entry or none.
// - Integrity: each entry carries magic, format version, the full key and an XXH3-128 checksum
//   (cache/entry_format.h); an entry failing any check is a miss, warned about, recompiled and
//   replaced, never returned.
// - One compile per key: within a process (threads wait for the one compiling), and across
//   processes through a per-key flock lock file (others wait, re-check and read the entry).
//   When locking fails or the wait exceeds lock_timeout, the caller compiles anyway.
// - Bounded size: after each publish, least-recently-used entries are deleted until the total is
//   under 90% of max_bytes. "Used" is the entry's mtime: set when written and touched on every
//   disk hit (atime is not used: relatime/noatime mounts make it unreliable). Temp files and lock
//   files older than temp_max_age are swept then too.
// - Permission safety: the directory is created 0700. A cache directory that is a symbolic link,
//   not a directory, owned by another user or writable by group/others is refused: the process
//   runs uncached. An entry that is a symbolic link, not a regular file, owned by another user or
//   writable by group/others is refused and left alone: that kernel is compiled and not cached.
//   Each refusal is warned about once per reason and counted in rejected_entries.
// - Cache faults never fail GetOrCompile: I/O errors, a full disk, a read-only directory, no home
//   directory cost the cache (warned once per reason, counted), never the result.
// - Remote tier (optional, CacheOptions::remote: a Redis server shared by a fleet,
//   cache/remote_tier.h): lookup order memory (the caller's) -> disk -> remote -> compile. A remote
//   hit is written to the disk cache; a compile is published to the remote store. Remote values
//   are entries in the same format, checked the same way (a bad one is a miss, counted, warned
//   about once, recompiled and republished). One compile per key across machines: a per-key
//   lock in the store, taken after the local one. The store being down, slow, full or refusing
//   the login never fails GetOrCompile and costs at most one timeout per retry interval.
#ifndef FUSEJIT_CACHE_KERNEL_CACHE_H_
#define FUSEJIT_CACHE_KERNEL_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/cache_key.h"
#include "cache/env.h"
#include "cache/remote_config.h"
#include "cache/store.h"

namespace fusejit::cache {

class LocalStore;  // cache/local_store.h

struct CacheOptions {
  // Cache directory. Empty: $FUSEJIT_CACHE_DIR, else $XDG_CACHE_HOME/fusejit, else
  // $HOME/.cache/fusejit (relative XDG_CACHE_HOME/HOME are ignored); none: uncached. A relative
  // directory (here or in FUSEJIT_CACHE_DIR) is refused: uncached, warned. Below XDG_CACHE_HOME or
  // HOME, the cache is created only when HOME (the parent of XDG_CACHE_HOME) exists.
  std::string dir;
  // Limit on the total size of entry files (and young temp files) in bytes; 0: no limit.
  uint64_t max_bytes = uint64_t{1} << 30;
  // false: no disk access at all; GetOrCompile only compiles (one compile per key in flight).
  bool disk_enabled = true;
  // true: entries are read, never written, touched, evicted or locked.
  bool read_only = false;
  // false: a missing cache directory is not created (the disk cache is then unusable). For tools
  // that only inspect the cache.
  bool create_directory = true;
  // How long to wait for another process compiling the same key before compiling anyway.
  absl::Duration lock_timeout = absl::Minutes(2);
  // Temp files and unused lock files older than this are deleted by the sweep after a publish.
  absl::Duration temp_max_age = absl::Minutes(10);
  // File system and environment; nullptr: PosixEnv(). Not owned; must outlive the cache.
  Env* env = nullptr;
  // Where warnings go (one line each, no trailing newline); nullptr: stderr. Each reason is
  // warned about at most once per KernelCache (so once per process for Default()).
  std::function<void(std::string_view)> warn;
  // The disk tier's store (cache/local_store.h); nullptr: the directory (cache/dir_store.h on dir,
  // max_bytes, read_only, create_directory, temp_max_age and env). Another store keeps its own
  // limits and modes; disk_enabled = false ignores it.
  std::shared_ptr<LocalStore> store;
  // The remote tier below the disk (cache/remote_config.h); nullopt: none.
  std::optional<RemoteOptions> remote;
  // true: a disk hit the remote store lacks (or holds a bad value for) is published there too
  // (`fusejit prewarm --remote`: fill the fleet's cache from this machine's).
  bool remote_fill = false;
};

// Options for Default(): FUSEJIT_CACHE_DIR (dir), FUSEJIT_CACHE_MAX_BYTES (bytes, or with a
// K/M/G suffix: binary multiples), FUSEJIT_DISABLE_CACHE (1/true/yes/on: disk_enabled = false),
// FUSEJIT_REMOTE_CACHE* (remote: RemoteOptionsFromEnvironment()).
// A malformed FUSEJIT_CACHE_MAX_BYTES is warned about on stderr and ignored.
CacheOptions CacheOptionsFromEnvironment(Env* env = nullptr);
// "1073741824", "512M", "1G", "64k" -> bytes. nullopt when malformed.
std::optional<uint64_t> ParseByteSize(std::string_view text);

// Counters since the cache was constructed (this process only).
struct CacheStats {
  uint64_t hits_memory = 0;       // counted by the caller's in-memory layer: RecordMemoryHit()
  uint64_t hits_disk = 0;         // payload read from a valid entry
  uint64_t misses = 0;            // disk usable, no valid entry: compiled
  uint64_t uncached = 0;          // compiled with no disk cache (disabled, unusable, refused entry)
  uint64_t coalesced = 0;         // waited for another thread's compile of the same key
  uint64_t lock_waits = 0;        // waited for another process holding the key's lock
  uint64_t compiles = 0;          // compile() calls
  uint64_t compile_failures = 0;  // compile() calls that returned an error
  double compile_ms = 0;          // total time in compile()
  uint64_t bytes_read = 0;        // entry bytes of disk hits
  uint64_t bytes_written = 0;     // entry bytes published
  uint64_t entries_written = 0;
  uint64_t evictions = 0;  // entries deleted by this process to stay under max_bytes
  uint64_t evicted_bytes = 0;
  uint64_t temp_files_swept = 0;  // orphaned temp files deleted
  uint64_t rejected_entries = 0;  // corrupt, foreign-key, wrong-version or refused entries met
  uint64_t read_failures = 0;     // I/O errors reading an entry
  uint64_t write_failures = 0;    // publishes that failed (full disk, read-only, I/O error)
  uint64_t lock_failures = 0;     // key locks that could not be taken (compiled without one)
  // The remote tier.
  uint64_t remote_hits = 0;      // valid values read (written to disk when it is usable)
  uint64_t remote_misses = 0;    // no value
  uint64_t remote_rejected = 0;  // values that failed a check (then republished)
  uint64_t remote_published = 0;
  uint64_t remote_write_failures = 0;  // publishes that failed or were over the size cap
  uint64_t remote_errors = 0;          // calls that failed (down, slow, refused, full, skipped)
  uint64_t remote_lock_waits = 0;      // waited for another machine's compile
  uint64_t remote_bytes_read = 0;
  uint64_t remote_bytes_written = 0;

  std::string ToString() const;  // "name value" lines
};

// The state of the disk part, decided once at first use.
enum class DiskState {
  kUsable,
  kDisabled,     // disk_enabled = false
  kNoDirectory,  // no FUSEJIT_CACHE_DIR, XDG_CACHE_HOME or HOME; a relative one; HOME missing
  kMissing,      // directory absent and create_directory = false
  kRefused,      // symlink, not a directory, foreign owner, group/other-writable
  kFailed,       // could not be created or examined
};

struct EntryInfo {
  std::string name;             // file name, EntryName()
  std::optional<CacheKey> key;  // from the header; nullopt when the entry is not valid
  uint64_t file_bytes = 0;
  uint64_t payload_bytes = 0;
  int64_t mtime_ns = 0;  // last use (see LRU above)
  int64_t atime_ns = 0;
  std::string problem;  // empty: valid; else why it would be rejected
};

struct VerifyReport {
  size_t checked = 0;
  size_t ok = 0;
  std::vector<std::pair<std::string, std::string>> bad;  // (entry name, problem)
  size_t removed = 0;
};

class LocalTier;   // cache/local_tier.h
class RemoteTier;  // cache/remote_tier.h
class Warnings;
struct Counters;

// Records the key of every KernelCache::GetOrCompile call (of any cache) made on the calling
// thread while it is alive: how a caller learns which entries a fusejit::Compile used (to re-check
// or inspect them later) without re-deriving the key. A call served from Compile's in-memory layer
// makes no GetOrCompile call and records nothing.
//
//   cache::KeyRecorder recorder;
//   auto compiled = fusejit::Compile(chain, options);
//   for (const cache::CacheKey& key : recorder.keys()) KernelCache::Default().Lookup(key);
//
// Recorders nest: only the innermost one records. REQUIRES: created and destroyed on one thread,
// innermost first; not copyable or movable.
class KeyRecorder {
 public:
  KeyRecorder();
  ~KeyRecorder();
  KeyRecorder(const KeyRecorder&) = delete;
  KeyRecorder& operator=(const KeyRecorder&) = delete;

  // In call order (a key appears once per call).
  const std::vector<CacheKey>& keys() const { return keys_; }

 private:
  friend class KernelCache;
  KeyRecorder* const outer_;
  std::vector<CacheKey> keys_;
};

// Thread-safe: every method may be called from any thread at any time.
class KernelCache {
 public:
  // The process-wide cache, configured by CacheOptionsFromEnvironment(). Never destroyed.
  static KernelCache& Default();

  explicit KernelCache(CacheOptions options);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // Returns the payload of a valid entry for key (disk, then remote), or runs compile(),
  // publishes its result (to the directory when writable, to the remote store) and returns it.
  // Errors from compile() are returned (and not cached); cache faults never are. *disk_hit
  // (optional) tells whether the payload came from a cache (disk or remote) rather than
  // compile(). REQUIRES: compile() does not call GetOrCompile for the same key (it would
  // deadlock).
  absl::StatusOr<std::string> GetOrCompile(const CacheKey& key,
                                           absl::FunctionRef<absl::StatusOr<std::string>()> compile,
                                           bool* disk_hit = nullptr);

  // The payload of a valid entry for key, if there is one: disk, then remote (a remote hit is
  // written to disk). Never compiles or waits.
  std::optional<std::string> Lookup(const CacheKey& key);

  // Publishes `payload` as key's entry, atomically replacing any entry there (for records that
  // are rewritten, such as tuning results; kernels go through GetOrCompile), on disk and in the
  // remote store (best effort, counted). Errors: FailedPrecondition when the directory is not
  // usable or is read-only, Unavailable when the write failed (counted and warned about like any
  // publish).
  absl::Status Put(const CacheKey& key, std::string_view payload);

  void RecordMemoryHit();
  CacheStats Stats() const;

  // For `fusejit cache list|verify|clear|stats`. Fail when the directory is not usable
  // (List and Usage return nothing for kMissing).
  absl::StatusOr<std::vector<EntryInfo>> List();
  absl::StatusOr<VerifyReport> Verify(bool remove_bad);
  // Deletes every entry, temp file and unused lock file; returns how many files were deleted.
  // Never deletes files whose names the cache does not produce.
  absl::StatusOr<size_t> Clear();
  absl::StatusOr<DiskUsage> Usage();
  // Evicts to the size limit and sweeps old temp/lock files now (done after every publish).
  absl::Status Trim();

  std::string directory() const;  // resolved directory; empty when there is none
  DiskState disk_state() const;
  bool disk_usable() const { return disk_state() == DiskState::kUsable; }
  std::string disk_status() const;  // "usable", "refused: ... is a symbolic link", ...
  uint64_t max_bytes() const { return options_.max_bytes; }
  const CacheOptions& options() const { return options_; }
  // CacheOptions::remote_fill, changed (for `fusejit prewarm --remote` on Default()).
  void set_remote_fill(bool fill) { remote_fill_ = fill; }

  // The remote tier, for `fusejit cache stats|verify --remote`. Without one: remote_configured()
  // false, and the others fail with FailedPrecondition.
  bool remote_configured() const { return remote_ != nullptr; }
  std::string remote_description() const;  // "redis://host:6379/0 (read-only)", or "none"
  absl::Status RemotePing();
  absl::StatusOr<StoreUsage> RemoteUsage();
  // Fleet-wide counters kept in the store (hits, misses, rejected, published).
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> RemoteCounters();
  // Re-checks every remote value (format, checksum, the key its name says); remove_bad deletes
  // bad ones (not in read-only mode).
  absl::StatusOr<VerifyReport> VerifyRemote(bool remove_bad);

 private:
  struct Flight;
  LocalTier& local() const;  // its store opened on first use
  absl::StatusOr<std::string> Lead(const CacheKey& key, const std::string& name, bool use_disk,
                                   absl::FunctionRef<absl::StatusOr<std::string>()> compile,
                                   bool* disk_hit);
  absl::StatusOr<std::string> RunCompile(absl::FunctionRef<absl::StatusOr<std::string>()> compile);
  // A remote hit: written to the disk cache when it is usable.
  void KeepRemoteHit(const CacheKey& key, const std::string& name, std::string_view payload);

  const CacheOptions options_;
  std::unique_ptr<Counters> counters_;
  std::unique_ptr<Warnings> warnings_;
  mutable std::unique_ptr<LocalTier> local_;  // set once, by local()
  std::unique_ptr<RemoteTier> remote_;  // null: no remote tier
  std::atomic<bool> remote_fill_;
  mutable absl::once_flag open_once_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_KERNEL_CACHE_H_
