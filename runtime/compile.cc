// fusejit::Compile: the stages of runtime/stages.h with the in-memory cache around them.
#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache/kernel_cache.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "runtime/dtype_adapter.h"
#include "runtime/stages.h"
#include "runtime/tap_gemm.h"
#include "tune/tuning_db.h"

namespace fusejit {
namespace {

// Everything a compiled chain depends on besides the generator itself.
struct MemoryKey {
  Chain chain;
  std::string arch;
  int sm_count = 0;
  Precision precision = Precision::kFp32;
  std::string strategy;
  std::string dump_dir;
  // The launch configuration is decided on a miss (given, tuned or default) from these.
  std::string tune_config;
  bool use_tuning = true;
  std::string device;  // DeviceKey name and driver version; "" without a device
  int driver_version = 0;
  const tune::TuningDb* tuning_db = nullptr;  // whose entries the plan may use
  bool operator==(const MemoryKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const MemoryKey& k) {
    return H::combine(std::move(h), k.chain, k.arch, k.sm_count, k.precision, k.strategy,
                      k.dump_dir, k.tune_config, k.use_tuning, k.device, k.driver_version,
                      k.tuning_db);
  }
};

struct MemoryCache {
  absl::Mutex mu;
  absl::flat_hash_map<MemoryKey, std::shared_ptr<CompiledChain>> entries ABSL_GUARDED_BY(mu);
};

MemoryCache& Memory() {
  static auto* cache = new MemoryCache();
  return *cache;
}

// Stores `compiled` under `key` and returns the cached instance (a concurrent compile of the same
// key may have won; its instance is used).
std::shared_ptr<CompiledChain> Remember(MemoryKey key, std::shared_ptr<CompiledChain> compiled) {
  MemoryCache& memory = Memory();
  absl::MutexLock lock(&memory.mu);
  auto [it, inserted] = memory.entries.emplace(std::move(key), std::move(compiled));
  return it->second;
}

}  // namespace

absl::StatusOr<std::shared_ptr<CompiledChain>> Compile(const Chain& chain,
                                                       const CompileOptions& options) {
  absl::StatusOr<runtime::Target> target = runtime::ResolveTarget(options);
  if (!target.ok()) return target.status();
  cache::KernelCache& kernel_cache =
      options.kernel_cache != nullptr ? *options.kernel_cache : cache::KernelCache::Default();
  tune::TuningDb& tuning_db =
      options.tuning_db != nullptr ? *options.tuning_db : tune::TuningDb::Default();
  const std::string dump_dir = runtime::DumpDir(options);
  const codegen::PlanTarget& t = target->plan_target;
  MemoryKey memory_key{chain,        t.arch,           t.sm_count,          options.precision,
                       options.strategy, dump_dir,     options.tune_config, options.use_tuning,
                       target->device.name, target->device.driver_version, &tuning_db};
  if (options.use_cache) {  // a hit was validated when it was stored
    MemoryCache& memory = Memory();
    absl::MutexLock lock(&memory.mu);
    auto it = memory.entries.find(memory_key);
    if (it != memory.entries.end()) {
      kernel_cache.RecordMemoryHit();
      return it->second;
    }
  }

  const auto remember = [&](absl::StatusOr<std::shared_ptr<CompiledChain>> compiled)
      -> absl::StatusOr<std::shared_ptr<CompiledChain>> {
    if (!compiled.ok() || !options.use_cache) return compiled;
    return Remember(std::move(memory_key), *std::move(compiled));
  };
  // tap-gemm by name: f32 chains as the composite; bf16, f16 through their f32 chain (below).
  const bool tap_gemm_named = options.strategy == codegen::kTapGemmStrategy;
  if (tap_gemm_named && chain.dtype == DType::kF32) {
    absl::StatusOr<std::optional<std::string>> why =
        runtime::ChooseTapGemm(chain, *target, options, nullptr);
    if (!why.ok()) return why.status();
    return remember(runtime::CompileTapGemm(chain, *target, options, **why));
  }

  // bf16, f16: natively where the dtype's plan runs it (runtime::PlanInItsDType); else the f32
  // chain between casts.
  absl::StatusOr<std::optional<runtime::PlannedChain>> planned =
      tap_gemm_named ? absl::StatusOr<std::optional<runtime::PlannedChain>>(std::nullopt)
                     : runtime::PlanInItsDType(chain, *target, options, tuning_db);
  if (!planned.ok()) return planned.status();
  if (!planned->has_value()) {
    absl::StatusOr<std::shared_ptr<CompiledChain>> inner =
        Compile(runtime::AsF32(chain), runtime::InnerOptions(options));
    if (!inner.ok()) return inner.status();
    return remember(
        runtime::AdaptDType(chain, *std::move(inner), /*forward=*/true, *target, options));
  }
  // An f32 chain with few output and many input channels: tap-gemm where it costs less.
  absl::StatusOr<std::optional<std::string>> tap_gemm =
      runtime::ChooseTapGemm(chain, *target, options, &**planned);
  if (!tap_gemm.ok()) return tap_gemm.status();
  if (tap_gemm->has_value()) {
    return remember(runtime::CompileTapGemm(chain, *target, options, **tap_gemm));
  }
  runtime::EmittedChain emitted = runtime::EmitChain(&**planned, /*want_ptx=*/!dump_dir.empty());
  CompileStats& stats = (*planned)->stats;
  absl::StatusOr<std::string> cubin = runtime::BuildCubin(
      **planned, emitted, options.use_cache && dump_dir.empty() ? &kernel_cache : nullptr, dump_dir,
      &stats);
  if (!cubin.ok()) return cubin.status();

  std::shared_ptr<CompiledChain> compiled =
      runtime::MakeCompiled(**std::move(planned), std::move(emitted), *std::move(cubin));
  if (options.use_cache) return Remember(std::move(memory_key), std::move(compiled));
  return compiled;
}

}  // namespace fusejit
