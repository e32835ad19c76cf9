// runtime/stages.cc: the compile pipeline's stages (runtime/stages.h).
#include "runtime/stages.h"

#include <cstdlib>

#include <chrono>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "jit/device.h"
#include "jit/driver.h"
#include "jit/dump.h"
#include "runtime/compiled_chain.h"

namespace fusejit::runtime {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Writes the generated source (and templates, so `nvcc -I DIR/templates FILE` compiles it) below
// `dir`, through jit/dump.h: the folder must be the user's own and not writable by others, files
// are published by rename and never written through a link. Returns the path of the main file.
// Best effort: an error is returned, never thrown.
absl::StatusOr<std::string> DumpSource(const std::string& dir, const codegen::GeneratedSource& src,
                                       const std::string& hash, const std::string& ptx) {
  const std::string templates = dir + "/templates";
  if (absl::Status s = jit::PrepareDumpDir(dir); !s.ok()) return s;
  if (absl::Status s = jit::PrepareDumpDir(templates); !s.ok()) return s;
  for (const auto& [name, text] : src.headers) {
    if (absl::Status s = jit::WriteDumpFile(templates, name, text); !s.ok()) return s;
  }
  const std::string stem = absl::StrCat(src.name.substr(0, src.name.size() - 3), "_",
                                        hash.substr(0, 12));
  if (absl::Status s = jit::WriteDumpFile(dir, stem + ".cu", src.main); !s.ok()) return s;
  if (!ptx.empty()) {
    if (absl::Status s = jit::WriteDumpFile(dir, stem + ".ptx", ptx); !s.ok()) return s;
  }
  return absl::StrCat(dir, "/", stem, ".cu");
}

}  // namespace

// The arch and SM count to plan for, and the device: the options' arch (and tuning_device), else
// the current context's device (queried once per context).
absl::StatusOr<Target> ResolveTarget(const CompileOptions& options) {
  Target r;
  codegen::PlanTarget& target = r.plan_target;
  target.precision = options.precision;
  target.arch = options.arch;
  if (!target.arch.empty()) {
    r.device = options.tuning_device;
    if (!r.device.empty() && r.device.sm_count > 0) target.sm_count = r.device.sm_count;
    return r;
  }
  absl::StatusOr<const jit::DriverApi*> driver = jit::Driver();
  CUcontext context = nullptr;
  if (driver.ok() && (*driver)->cuCtxGetCurrent(&context) == CUDA_SUCCESS && context) {
    static absl::Mutex mu(absl::kConstInit);
    static auto* devices = new absl::flat_hash_map<CUcontext, jit::DeviceInfo>();
    absl::MutexLock lock(&mu);
    auto it = devices->find(context);
    if (it == devices->end()) {
      absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();
      if (device.ok()) it = devices->emplace(context, *device).first;
    }
    if (it != devices->end()) {
      target.arch = it->second.arch;
      target.sm_count = it->second.sm_count;
      r.device = {it->second.name, it->second.sm_count, it->second.driver_version};
      return r;
    }
  }
  absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();  // for its error message
  const absl::Status status = device.ok() ? absl::InternalError("no device") : device.status();
  return absl::Status(status.code(),
                      absl::StrCat("compiling for the current device: ", status.message(),
                                   " (give an explicit arch such as sm_90 to compile without a "
                                   "GPU)"));
}

absl::StatusOr<PlannedChain> PlanChain(const Chain& chain, const Target& target,
                                       const CompileOptions& options, tune::TuningDb& tuning_db) {
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  PlannedChain planned{chain, target, {}, {}};
  CompileStats& stats = planned.stats;
  const auto t0 = std::chrono::steady_clock::now();
  // The launch configuration: given, else tuned for this device (tune/tuning_db.h), else the
  // strategy's default.
  std::optional<codegen::TuneConfig> config;
  stats.tune_origin = "default";
  if (!options.tune_config.empty()) {
    absl::StatusOr<codegen::TuneConfig> given = codegen::TuneConfig::Parse(options.tune_config);
    if (!given.ok()) return given.status();
    if (!options.strategy.empty() && given->strategy != options.strategy) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", options.tune_config,
                                                     " is for strategy ", given->strategy,
                                                     ", not the strategy asked for, ",
                                                     options.strategy));
    }
    config = *std::move(given);
    stats.tune_origin = "given";
  } else if (options.use_tuning && !target.device.empty()) {
    // Records are tuned for the plain forward: a forward keeping u (a training forward) looks up
    // that one, and uses its configuration where it also fits the forward keeping u (an igemm
    // plan whose 16-bit sums are flushed there holds fewer warpgroups), else the default,
    // without a warning: the record itself is fine.
    codegen::PlanTarget plain = target.plan_target;
    plain.keeps_u = false;
    config = tuning_db.Find(chain, plain, target.device);
    if (config.has_value() && !options.strategy.empty() && config->strategy != options.strategy) {
      config.reset();
    }
    if (config.has_value() && target.plan_target.keeps_u &&
        !codegen::ValidateConfig(chain, target.plan_target, *config).ok()) {
      config.reset();
    }
    if (config.has_value()) stats.tune_origin = "tuned";
  }
  absl::StatusOr<codegen::Plan> plan =
      config.has_value() ? codegen::MakePlan(chain, target.plan_target, *config)
                         : codegen::MakePlan(chain, target.plan_target, options.strategy);
  if (!plan.ok()) return plan.status();
  planned.plan = *std::move(plan);
  stats.plan_ms = MsSince(t0);
  return planned;
}

EmittedChain EmitChain(PlannedChain* planned, bool want_ptx) {
  const auto t0 = std::chrono::steady_clock::now();
  EmittedChain e;
  e.source = codegen::EmitSource(planned->chain, planned->plan);
  std::vector<std::string_view> header_texts;
  for (const auto& h : e.source.headers) header_texts.push_back(h.second);

  // A plan may need an architecture-specific build of the target's arch (sm_90a for wgmma); the
  // compiled chain still reports the target's arch (the device it runs on).
  const std::string arch = planned->plan.arch_override.empty() ? planned->target.plan_target.arch
                                                               : planned->plan.arch_override;
  e.request.name = e.source.name;
  e.request.source = e.source.main;
  e.request.headers = e.source.headers;
  e.request.arch = arch;
  e.request.options = e.source.nvrtc_options;
  e.request.want_ptx = want_ptx;

  e.key.source_hash = cache::HashSource(e.source.main, header_texts);
  e.key.generator_version = GeneratorVersion();
  e.key.nvrtc_version = jit::NvrtcVersion();
  e.key.options = absl::StrJoin(e.request.options, " ");
  e.key.arch = arch;
  e.key.spec = FormatChain(planned->chain);
  planned->stats.codegen_ms = MsSince(t0);
  return e;
}

absl::StatusOr<std::string> BuildCubin(const PlannedChain& planned, const EmittedChain& emitted,
                                       cache::KernelCache* cache, const std::string& dump_dir,
                                       CompileStats* stats) {
  std::string ptx;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(emitted.request);
    if (!result.ok()) {
      // Where the failing source goes when no dump folder was asked for: a new private folder
      // (jit/dump.h), the newest few kept.
      absl::StatusOr<std::string> dir =
          dump_dir.empty() ? jit::NewPrivateDumpDir("failed") : absl::StatusOr<std::string>(dump_dir);
      absl::StatusOr<std::string> path =
          dir.ok() ? DumpSource(*dir, emitted.source, emitted.key.source_hash, "") : dir.status();
      return absl::Status(result.status().code(),
                          absl::StrCat("compiling ", emitted.key.spec, " (plan ",
                                       planned.plan.strategy, "): ", result.status().message(),
                                       "\ngenerated source: ",
                                       path.ok() ? *path : path.status().ToString()));
    }
    stats->nvrtc_ms = result->compile_ms;
    ptx = std::move(result->ptx);
    return std::move(result->cubin);
  };
  absl::StatusOr<std::string> cubin;
  if (cache != nullptr) {
    bool hit = false;
    cubin = cache->GetOrCompile(emitted.key, compile, &hit);
    stats->cache_hit = hit;
  } else {
    cubin = compile();
  }
  if (!cubin.ok()) return cubin.status();
  if (!dump_dir.empty()) {
    absl::StatusOr<std::string> path =
        DumpSource(dump_dir, emitted.source, emitted.key.source_hash, ptx);
    if (!path.ok()) return path.status();
    stats->source_path = *path;
  }
  return cubin;
}

std::shared_ptr<CompiledChain> MakeCompiled(PlannedChain planned, EmittedChain emitted,
                                            std::string cubin) {
  return std::make_shared<CompiledChainImpl>(
      std::move(planned.chain), std::move(planned.plan), planned.target.plan_target.arch,
      std::move(emitted.source.main), std::move(cubin), std::move(planned.stats));
}

std::string DumpDir(const CompileOptions& options) {
  if (!options.dump_dir.empty()) return options.dump_dir;
  const char* env = std::getenv("FUSEJIT_DUMP_DIR");
  return env ? env : "";
}

absl::Status WithContext(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

absl::StatusOr<std::shared_ptr<CompiledChain>> BuildPlanned(PlannedChain planned,
                                                            const CompileOptions& options) {
  const std::string dump_dir = DumpDir(options);
  EmittedChain emitted = EmitChain(&planned, /*want_ptx=*/!dump_dir.empty());
  cache::KernelCache& kernel_cache =
      options.kernel_cache != nullptr ? *options.kernel_cache : cache::KernelCache::Default();
  absl::StatusOr<std::string> cubin =
      BuildCubin(planned, emitted, options.use_cache && dump_dir.empty() ? &kernel_cache : nullptr,
                 dump_dir, &planned.stats);
  if (!cubin.ok()) return cubin.status();
  return MakeCompiled(std::move(planned), std::move(emitted), *std::move(cubin));
}

}  // namespace fusejit::runtime
