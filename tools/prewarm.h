// tools/prewarm.h: fill the kernel cache for a list of chains and architectures, in parallel,
// and re-check what is there (the engine behind `fusejit prewarm`, tools/cmd_prewarm.cc).
//
// Each (chain, target) pair is compiled with fusejit::Compile and the CompileOptions a later run
// would pass (options.compile, with arch set per target), so whatever Compile decides (plan,
// tuned configuration, architecture-specific build) is what gets cached, under the key that run
// will look up. Pairs whose entry is already on disk are read, not compiled ("cached").
//
// Thread safety: RunPrewarm starts and joins its own workers; it uses KernelCache::Default() and
// Compile's in-memory cache, which are process-wide.
#ifndef FUSEJIT_TOOLS_PREWARM_H_
#define FUSEJIT_TOOLS_PREWARM_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_key.h"
#include "cache/kernel_cache.h"
#include "fusejit/fusejit.h"

namespace fusejit::tools {

struct PrewarmTarget {
  // CompileOptions::arch: "sm_80", ...; empty: device 0, as a run on it with no arch asks (each
  // worker makes device 0's primary context current, so plans see its real SM count).
  std::string arch;
  std::string label;  // for reports: the arch, or the device's arch for an empty one
};

enum class PrewarmOutcome { kCompiled, kCached, kFailed };

struct PrewarmResult {
  size_t chain = 0;   // index into the chains
  size_t target = 0;  // index into options.targets
  PrewarmOutcome outcome = PrewarmOutcome::kFailed;
  std::string error;  // kFailed: Compile's error
  double ms = 0;      // wall time of the Compile call
  // The cache keys Compile used (cache::KeyRecorder); empty when it was served from memory.
  std::vector<cache::CacheKey> keys;
  std::shared_ptr<CompiledChain> compiled;  // null when failed
};

struct PrewarmOptions {
  std::vector<PrewarmTarget> targets;
  int jobs = 1;            // worker threads (at most one per pair is used)
  CompileOptions compile;  // as a later run would ask; arch is set per target; use_cache forced
  // Called after each pair, from the worker that did it (serialized by RunPrewarm).
  std::function<void(const PrewarmResult&)> on_done;
};

struct PrewarmReport {
  std::vector<PrewarmResult> results;  // chain-major, target-minor order
  double wall_ms = 0;
  // KernelCache::Default() counters over the run (this process): entries written, write
  // failures, rejected entries (corrupt ones found and replaced), evictions...
  cache::CacheStats cache_delta;
};

// Compiles every (chain, target) pair on options.jobs threads. Never fails as a whole: each
// pair's failure is in its result.
PrewarmReport RunPrewarm(const std::vector<Chain>& chains, const PrewarmOptions& options);

struct VerifyOptions {
  // Load each module whose target matches this architecture (device 0's, e.g. "sm_90"; a target
  // of the same arch with an 'a' suffix matches too). Empty: no loading.
  // REQUIRES (when set): device 0's context is current on the calling thread.
  std::string load_arch;
};

struct VerifyReport {
  size_t checked = 0;       // entries looked up
  size_t ok = 0;            // entries whole and valid (checksum and key)
  size_t loaded = 0;        // modules loaded
  size_t not_loaded = 0;    // pairs of another architecture than load_arch (all when it is empty)
  // (pair label, problem): a missing or invalid entry, a failed load.
  std::vector<std::pair<std::string, std::string>> problems;
};

// Re-reads every entry the successful pairs of `report` used from disk (KernelCache::Lookup:
// checksum and full key), and loads the modules of load_arch. Failed pairs are skipped (they are
// already reported). `label(result)` names a pair in problems.
VerifyReport VerifyPrewarm(const PrewarmReport& report, const PrewarmOptions& options,
                           const VerifyOptions& verify,
                           const std::function<std::string(const PrewarmResult&)>& label);

// CacheStats b - a, field by field (compile_ms included).
cache::CacheStats CacheStatsDelta(const cache::CacheStats& a, const cache::CacheStats& b);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_PREWARM_H_
