// runtime/stages.h: the compile pipeline as stage functions over stage types.
//
//   Chain, CompileOptions
//     --ResolveTarget--> Target         the arch, SM count and device to plan for
//     --PlanChain------> PlannedChain   the plan: given, tuned (tuning database) or default config
//     --EmitChain------> EmittedChain   CUDA source, the NVRTC request, the kernel-cache key
//     --BuildCubin-----> cubin          the kernel cache, else NVRTC
//     --MakeCompiled---> CompiledChain  launchable (runtime/compiled_chain.h; loads on first use)
//
// fusejit::Compile (runtime/compile.cc) is these stages with the in-memory cache around them.
// Tools and tests may call them one at a time. The kernel cache and the tuning database are
// parameters (CompileOptions::kernel_cache / tuning_db; nullptr means the process defaults).
#ifndef FUSEJIT_RUNTIME_STAGES_H_
#define FUSEJIT_RUNTIME_STAGES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cache/kernel_cache.h"
#include "codegen/emit.h"
#include "codegen/plan.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "jit/nvrtc.h"
#include "tune/tuning_db.h"

namespace fusejit::runtime {

struct Target {
  codegen::PlanTarget plan_target;  // arch, SM count, precision
  DeviceKey device;                 // whose tuned entries apply; empty: none
};

// The options' arch (and tuning_device), else the current context's device (queried once per
// context). Error when neither is there, saying to give an arch.
absl::StatusOr<Target> ResolveTarget(const CompileOptions& options);

struct PlannedChain {
  Chain chain;
  Target target;
  codegen::Plan plan;
  CompileStats stats;  // plan_ms and tune_origin so far
};

// Validates `chain` and plans it with the configuration given in `options`, else the tuning
// database's for target.device, else the strategy's default.
absl::StatusOr<PlannedChain> PlanChain(const Chain& chain, const Target& target,
                                       const CompileOptions& options, tune::TuningDb& tuning_db);

struct EmittedChain {
  codegen::GeneratedSource source;
  jit::NvrtcRequest request;  // for the plan's arch (arch_override, e.g. sm_90a, when it has one)
  cache::CacheKey key;
};

// Emits the source of `planned` (records codegen_ms in planned->stats).
EmittedChain EmitChain(PlannedChain* planned, bool want_ptx);

// The cubin: from `cache` (when non-null; compiled and stored there on a miss) or compiled with
// NVRTC. A failing compile's source is dumped (to `dump_dir`, else a new private folder) and the
// error names it. With `dump_dir` the source (and PTX) is written there and its path recorded.
absl::StatusOr<std::string> BuildCubin(const PlannedChain& planned, const EmittedChain& emitted,
                                       cache::KernelCache* cache, const std::string& dump_dir,
                                       CompileStats* stats);

// The launchable chain (its module is loaded into a context on first use).
std::shared_ptr<CompiledChain> MakeCompiled(PlannedChain planned, EmittedChain emitted,
                                            std::string cubin);

// The dump folder: options.dump_dir, else $FUSEJIT_DUMP_DIR, else "".
std::string DumpDir(const CompileOptions& options);

// EmitChain, BuildCubin (with options' kernel cache and dump folder) and MakeCompiled: a plan
// made outside the planner (the backward's kernels, dtype casts) to a launchable chain.
absl::StatusOr<std::shared_ptr<CompiledChain>> BuildPlanned(PlannedChain planned,
                                                            const CompileOptions& options);

// s with "what: " before its message (same code): which step of a composite build failed.
absl::Status WithContext(const absl::Status& s, const std::string& what);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_STAGES_H_
