// tune/tuning_db.h: the tuning database: the launch configuration `fusejit autotune` measured
// best for a chain on a kind of GPU, stored beside the kernel cache, used by fusejit::Compile.
//
//   <kernel cache dir>/tuning/<32 hex>.fjk     one record per (spec, arch, precision, device, SMs)
//
// Storage is the kernel cache's (cache/kernel_cache.h, a KernelCache on that folder), so the
// same promises hold: atomic publish (temp file, fsync, rename), a checksummed entry whose header
// repeats its key, a private 0700 directory, symbolic links and foreign or group/other-writable
// files refused, faults costing the database (warned once), never the compile.
//
// Key: the entry name hashes the canonical spec, arch, precision, device name and SM count; the
// record also holds the driver version and the fusejit version that wrote it. A lookup uses an
// entry only when it is whole, both versions match the current ones (else: stale), its strategy
// exists and applies and its configuration passes the strategy's Validate(); otherwise the
// default is used and the entry is warned about once per process ("fusejit tuning: ...").
// Re-running autotune replaces it.
//
// Shared by a fleet: with a remote tier (FUSEJIT_REMOTE_CACHE, cache/remote_config.h) records are
// also published to it (under the prefix + "tuning:") and a record missing on disk is read from
// it (and written to disk), so one machine's autotune serves every machine with that GPU. Remote
// records are checked like local ones (entry checksum and key, then everything above).
//
// Thread-safe.
#ifndef FUSEJIT_TUNE_TUNING_DB_H_
#define FUSEJIT_TUNE_TUNING_DB_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/env.h"
#include "cache/kernel_cache.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"

namespace fusejit::tune {

// What a record belongs to.
struct TuningKey {
  std::string spec;  // canonical: FormatChain(chain)
  std::string arch;  // "sm_90"
  Precision precision = Precision::kFp32;
  DeviceKey device;  // name and sm_count name the entry; driver_version is checked on use

  // The kernel-cache key of the record's entry (cache/cache_key.h): source_hash hashes the
  // fields above but the driver version, generator_version is the record format.
  cache::CacheKey ToCacheKey() const;
};

// One tuning result.
struct TuningRecord {
  TuningKey key;
  std::string fusejit_version;  // GeneratorBuild() of the process that measured it
  std::string config;           // the chosen configuration, TuneConfig text
  std::string default_config;   // the heuristic's, for reference
  double default_ms = 0;        // median times measured (L2 flushed)
  double best_ms = 0;
  int tried = 0;     // configurations measured
  int rejected = 0;  // outputs that differed from the default configuration's
  int failed = 0;    // compile or run errors
  double tuning_s = 0;
  std::string tuned_at;  // UTC, "2026-11-22T10:11:12Z"

  // Readable "name: value" lines (see tuning_db.cc). Values must be single lines.
  std::string Encode() const;
  // DataLoss naming the problem for anything Encode() would not have written.
  static absl::StatusOr<TuningRecord> Decode(std::string_view text);
};

struct TuningDbOptions {
  // The database folder. Empty: "<dir>/tuning" beside KernelCache::Default()'s directory, or no
  // database when that cache has no usable directory (FUSEJIT_DISABLE_CACHE=1 included).
  std::string dir;
  // false: no database (lookups find nothing, stores fail). Default(): FUSEJIT_DISABLE_TUNING.
  bool enabled = true;
  bool read_only = false;
  // Not owned; nullptr: cache::PosixEnv().
  cache::Env* env = nullptr;
  // One line each, no newline; nullptr: stderr.
  std::function<void(std::string_view)> warn;
  // The remote tier. Default(): the kernel cache's (KernelCache::Default()), its prefix
  // followed by "tuning:".
  std::optional<cache::RemoteOptions> remote;
};

class TuningDb {
 public:
  // The process-wide database (options from the environment). Never destroyed.
  static TuningDb& Default();
  // Tests only: makes Default() return `db` (nullptr: the real one again). Returns the previous
  // override. REQUIRES: `db` outlives its use; no Compile running concurrently.
  static TuningDb* SetDefaultForTesting(TuningDb* db);

  explicit TuningDb(TuningDbOptions options);
  TuningDb(const TuningDb&) = delete;
  TuningDb& operator=(const TuningDb&) = delete;

  // The configuration to use for `chain` on `device` for `target`, when a usable entry exists
  // (see the top of this file); nullopt otherwise. REQUIRES: chain is valid; device non-empty.
  std::optional<codegen::TuneConfig> Find(const Chain& chain, const codegen::PlanTarget& target,
                                          const DeviceKey& device);

  // The record stored under `key`, checked for integrity only. NotFound when there is none (or
  // no database); DataLoss for a corrupt or foreign entry.
  absl::StatusOr<TuningRecord> Read(const TuningKey& key);

  // Writes (or replaces) record's entry atomically. Errors: no usable database, a write failure.
  absl::Status Store(const TuningRecord& record);

  std::string directory() const;  // "" when there is none
  bool usable() const;

 private:
  cache::KernelCache& store() const;  // opened on first use
  void WarnOnce(const std::string& entry, std::string_view message);

  TuningDbOptions options_;
  mutable absl::once_flag open_once_;
  mutable std::unique_ptr<cache::KernelCache> store_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> warned_ ABSL_GUARDED_BY(mu_);
};

std::string_view PrecisionName(Precision p);  // "fp32", "tf32"

}  // namespace fusejit::tune

#endif  // FUSEJIT_TUNE_TUNING_DB_H_
