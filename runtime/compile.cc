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

  // bf16, f16: natively when the f32 chain's strategy reads and writes the dtype itself (the
  // generic ones: the same kernels, fewer bytes); else the f32 chain between casts. Natively, the
  // dtype chain is planned again among the strategies that run the dtype, by their costs for it
  // (16-bit tensor-core products run at other rates than the f32 chain's), unless the caller
  // named a strategy or configuration.
  CompileOptions effective = options;
  std::string native_choice, native_note;
  if (runtime::RunsThroughF32(chain.dtype)) {
    if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
    // A named configuration names the strategy (and is checked against the chain it runs on:
    // this one when its strategy handles the dtype, else the f32 chain); otherwise the f32
    // chain's plan picks it.
    std::string strategy_name, choice;
    if (!options.tune_config.empty()) {
      absl::StatusOr<codegen::TuneConfig> given = codegen::TuneConfig::Parse(options.tune_config);
      if (!given.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tune config ", options.tune_config, ": ", given.status().message()));
      }
      strategy_name = given->strategy;
      choice = "the configuration given";
    } else {
      absl::StatusOr<runtime::PlannedChain> f32 = runtime::PlanChain(
          runtime::AsF32(chain), *target, runtime::InnerOptions(options), tuning_db);
      if (!f32.ok()) return f32.status();
      strategy_name = f32->plan.strategy;
      choice = absl::StrCat("the f32 chain's plan (", f32->plan.choice, ")");
    }
    const codegen::Strategy* strategy = codegen::FindStrategy(strategy_name);
    if (strategy != nullptr && strategy->HandlesDType(chain.dtype)) {
      // The configuration is the dtype chain's own (a tuned one for this chain, else the default
      // for its precision: tc-conv and igemm multiply bf16/f16 in one 16-bit product and tile
      // for that), unless the caller named one.
      if (options.strategy.empty() && options.tune_config.empty()) {
        native_note = absl::StrCat("; natively in ", DTypeName(chain.dtype), " (", choice, " is ",
                                   strategy_name, ")");
      } else {
        effective.strategy = strategy_name;
        native_choice = absl::StrCat(choice, ", run natively in ", DTypeName(chain.dtype));
      }
    } else {
      absl::StatusOr<std::shared_ptr<CompiledChain>> inner =
          Compile(runtime::AsF32(chain), runtime::InnerOptions(options));
      if (!inner.ok()) return inner.status();
      absl::StatusOr<std::shared_ptr<CompiledChain>> adapted =
          runtime::AdaptDType(chain, *std::move(inner), /*forward=*/true, *target, options);
      if (!adapted.ok() || !options.use_cache) return adapted;
      return Remember(std::move(memory_key), *std::move(adapted));
    }
  }

  absl::StatusOr<runtime::PlannedChain> planned =
      runtime::PlanChain(chain, *target, effective, tuning_db);
  if (!planned.ok()) return planned.status();
  if (!native_choice.empty()) planned->plan.choice = native_choice;
  planned->plan.choice += native_note;
  runtime::EmittedChain emitted = runtime::EmitChain(&*planned, /*want_ptx=*/!dump_dir.empty());
  CompileStats& stats = planned->stats;
  absl::StatusOr<std::string> cubin = runtime::BuildCubin(
      *planned, emitted, options.use_cache && dump_dir.empty() ? &kernel_cache : nullptr,
      dump_dir, &stats);
  if (!cubin.ok()) return cubin.status();

  std::shared_ptr<CompiledChain> compiled =
      runtime::MakeCompiled(*std::move(planned), std::move(emitted), *std::move(cubin));
  if (options.use_cache) return Remember(std::move(memory_key), std::move(compiled));
  return compiled;
}

}  // namespace fusejit
