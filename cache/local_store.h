// cache/local_store.h: what KernelCache's disk tier (cache/local_tier.h) needs of its store beyond
// Store (cache/store.h): a state decided when it is opened, paths for messages, a read-only mode,
// least-recently-used bookkeeping, and the maintenance `fusejit cache` does. DirStore
// (cache/dir_store.h) is the one on a directory; tests put others beside it.
//
// The Store methods keep their contracts, with these for a local store:
// - Get fails with PermissionDenied for a refused entry (leave it; compile uncached), DataLoss for
//   one to replace, Unavailable (or another code) for an I/O error; each with a StoreReason.
// - Put, TryLock, Remove, Touch, Trim and Clear write nothing while read_only().
//   Put and TryLock fail with PermissionDenied when they find the store read-only (it warned, and
//   read_only() is true from then on). A lock lapses when its holder's process dies.
// - Usage counts debris (temp and lock files) besides entries.
// Thread-safe.
#ifndef FUSEJIT_CACHE_LOCAL_STORE_H_
#define FUSEJIT_CACHE_LOCAL_STORE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kernel_cache.h"
#include "cache/store.h"

namespace fusejit::cache {

// What LocalStore::Stat reports of an entry.
struct EntryStat {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;  // last use: set when written and by Touch
  int64_t atime_ns = 0;
};

class LocalStore : public Store {
 public:
  // Its state, decided once when it was constructed; every other method but Describe fails (or
  // does nothing) unless kUsable. List, Usage and Clear find nothing when kMissing.
  virtual DiskState state() const = 0;
  // "usable", "usable, read-only", "refused: ... is a symbolic link", ...
  virtual std::string status_text() const = 0;
  // Where name's entry is, for messages (a file's path).
  virtual std::string Locate(std::string_view name) const = 0;
  // Whether writes are off: configured so, or found so (a read-only file system). Once true,
  // stays true.
  virtual bool read_only() const = 0;
  // Unlock, and deletes what the lock leaves in the store (a lock file) if no process can be
  // using it: at the end of a compile, so that lock files last only while keys are compiled.
  // (Unlock keeps it: a hit found while holding the lock leaves it to Trim's sweep.)
  virtual absl::Status UnlockAndDelete(std::string_view name, std::string_view token) = 0;
  // Marks name's entry as just used, for least-recently-used eviction. Best effort: a failure
  // only ages the entry (a read-only store is noted and warned about).
  virtual void Touch(std::string_view name) = 0;
  // Size and times of name's entry; NotFound (or another error) when it cannot be examined.
  virtual absl::StatusOr<EntryStat> Stat(std::string_view name) = 0;
  // Evicts least-recently-used entries when over the store's size limit and deletes old debris.
  // Faults are warned about; what it evicts and sweeps is counted by the store.
  virtual absl::Status Trim() = 0;
  // Deletes every entry and all debris; returns how many items were deleted. Fails with
  // FailedPrecondition when read-only.
  virtual absl::StatusOr<size_t> Clear() = 0;
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_LOCAL_STORE_H_
