#include "tools/prewarm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "jit/device.h"

namespace fusejit::tools {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

PrewarmResult CompileOne(const Chain& chain, const CompileOptions& options) {
  PrewarmResult r;
  cache::KeyRecorder recorder;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(chain, options);
  r.ms = MsSince(t0);
  r.keys = recorder.keys();
  if (!compiled.ok()) {
    r.outcome = PrewarmOutcome::kFailed;
    r.error = std::string(compiled.status().message());
    return r;
  }
  // No GetOrCompile call: Compile's in-memory cache had it (compiled earlier in this process).
  const bool cached = (*compiled)->stats().cache_hit || r.keys.empty();
  r.outcome = cached ? PrewarmOutcome::kCached : PrewarmOutcome::kCompiled;
  r.compiled = *std::move(compiled);
  return r;
}

// Whether a module built for `target_arch` loads on a device of `device_arch` ("sm_90" loads
// "sm_90" and "sm_90a").
bool Loadable(const std::string& target_arch, const std::string& device_arch) {
  return target_arch == device_arch || target_arch == device_arch + "a";
}

}  // namespace

cache::CacheStats CacheStatsDelta(const cache::CacheStats& a, const cache::CacheStats& b) {
  cache::CacheStats d;
  d.hits_memory = b.hits_memory - a.hits_memory;
  d.hits_disk = b.hits_disk - a.hits_disk;
  d.misses = b.misses - a.misses;
  d.uncached = b.uncached - a.uncached;
  d.coalesced = b.coalesced - a.coalesced;
  d.lock_waits = b.lock_waits - a.lock_waits;
  d.compiles = b.compiles - a.compiles;
  d.compile_failures = b.compile_failures - a.compile_failures;
  d.compile_ms = b.compile_ms - a.compile_ms;
  d.bytes_read = b.bytes_read - a.bytes_read;
  d.bytes_written = b.bytes_written - a.bytes_written;
  d.entries_written = b.entries_written - a.entries_written;
  d.evictions = b.evictions - a.evictions;
  d.evicted_bytes = b.evicted_bytes - a.evicted_bytes;
  d.temp_files_swept = b.temp_files_swept - a.temp_files_swept;
  d.rejected_entries = b.rejected_entries - a.rejected_entries;
  d.read_failures = b.read_failures - a.read_failures;
  d.write_failures = b.write_failures - a.write_failures;
  d.lock_failures = b.lock_failures - a.lock_failures;
  d.remote_hits = b.remote_hits - a.remote_hits;
  d.remote_misses = b.remote_misses - a.remote_misses;
  d.remote_rejected = b.remote_rejected - a.remote_rejected;
  d.remote_published = b.remote_published - a.remote_published;
  d.remote_write_failures = b.remote_write_failures - a.remote_write_failures;
  d.remote_errors = b.remote_errors - a.remote_errors;
  d.remote_lock_waits = b.remote_lock_waits - a.remote_lock_waits;
  d.remote_bytes_read = b.remote_bytes_read - a.remote_bytes_read;
  d.remote_bytes_written = b.remote_bytes_written - a.remote_bytes_written;
  return d;
}

PrewarmReport RunPrewarm(const std::vector<Chain>& chains, const PrewarmOptions& options) {
  PrewarmReport report;
  const size_t targets = options.targets.size();
  const size_t pairs = chains.size() * targets;
  report.results.resize(pairs);
  cache::KernelCache& cache = cache::KernelCache::Default();
  const cache::CacheStats before = cache.Stats();
  const auto t0 = std::chrono::steady_clock::now();

  std::atomic<size_t> next{0};
  absl::Mutex done_mu;
  auto work = [&] {
    // Device targets compile under device 0's primary context, as a run on it would.
    std::optional<jit::ScopedPrimaryContext> context;
    std::optional<absl::Status> context_error;
    for (size_t i = next++; i < pairs; i = next++) {
      const size_t c = i / targets, t = i % targets;
      const PrewarmTarget& target = options.targets[t];
      PrewarmResult r;
      CompileOptions compile_options = options.compile;
      compile_options.arch = target.arch;
      compile_options.use_cache = true;
      if (target.arch.empty() && !context.has_value() && !context_error.has_value()) {
        absl::StatusOr<jit::ScopedPrimaryContext> created = jit::ScopedPrimaryContext::Create(0);
        if (created.ok()) {
          context.emplace(*std::move(created));
        } else {
          context_error = created.status();
        }
      }
      if (target.arch.empty() && context_error.has_value()) {
        r.error = absl::StrCat("device 0: ", context_error->message());
      } else {
        r = CompileOne(chains[c], compile_options);
      }
      r.chain = c;
      r.target = t;
      report.results[i] = std::move(r);
      if (options.on_done) {
        absl::MutexLock lock(&done_mu);
        options.on_done(report.results[i]);
      }
    }
  };
  const size_t jobs = std::clamp<size_t>(static_cast<size_t>(std::max(options.jobs, 1)), 1,
                                         std::max<size_t>(pairs, 1));
  std::vector<std::thread> workers;
  for (size_t j = 1; j < jobs; ++j) workers.emplace_back(work);
  work();  // the calling thread is a worker too
  for (std::thread& w : workers) w.join();

  report.wall_ms = MsSince(t0);
  report.cache_delta = CacheStatsDelta(before, cache.Stats());
  return report;
}

VerifyReport VerifyPrewarm(const PrewarmReport& report, const PrewarmOptions& options,
                           const VerifyOptions& verify,
                           const std::function<std::string(const PrewarmResult&)>& label) {
  VerifyReport v;
  cache::KernelCache& cache = cache::KernelCache::Default();
  // Why an entry is invalid, by file name; read from the directory once, when first needed.
  std::optional<absl::flat_hash_map<std::string, std::string>> problems;
  auto problem_of = [&](const std::string& name) -> std::string {
    if (!problems.has_value()) {
      problems.emplace();
      absl::StatusOr<std::vector<cache::EntryInfo>> entries = cache.List();
      if (entries.ok()) {
        for (const cache::EntryInfo& e : *entries) (*problems)[e.name] = e.problem;
      }
    }
    auto it = problems->find(name);
    if (it == problems->end()) {
      return absl::StrCat("entry ", name,
                          " is missing (evicted to stay under the size limit, or never written: "
                          "see the warnings above)");
    }
    return absl::StrCat("entry ", name, " is invalid: ",
                        it->second.empty() ? "refused or unreadable" : it->second);
  };
  for (const PrewarmResult& r : report.results) {
    if (r.outcome == PrewarmOutcome::kFailed) continue;
    bool whole = true;
    if (r.keys.empty()) {
      v.problems.emplace_back(label(r), "no cache entry to check: compiled earlier in this "
                                        "process (served from memory)");
      whole = false;
    }
    for (const cache::CacheKey& key : r.keys) {
      ++v.checked;
      if (cache.Lookup(key).has_value()) {
        ++v.ok;
      } else {
        v.problems.emplace_back(label(r), problem_of(key.EntryName()));
        whole = false;
      }
    }
    const PrewarmTarget& target = options.targets[r.target];
    if (verify.load_arch.empty() ||
        !(target.arch.empty() || Loadable(target.arch, verify.load_arch))) {
      ++v.not_loaded;
      continue;
    }
    if (!whole) continue;  // already a problem
    if (absl::Status s = r.compiled->Load(); !s.ok()) {
      v.problems.emplace_back(label(r), absl::StrCat("load: ", s.message()));
    } else {
      ++v.loaded;
    }
  }
  return v;
}

}  // namespace fusejit::tools
