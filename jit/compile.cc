// fusejit::Compile: chain -> plan -> source -> cubin (NVRTC or the kernel cache) -> CompiledChain.
#include <chrono>
#include <cstdlib>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cache/kernel_cache.h"
#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/fusejit.h"
#include "jit/compiled_chain.h"
#include "jit/device.h"
#include "jit/driver.h"
#include "jit/dump.h"
#include "jit/nvrtc.h"
#include "tune/tuning_db.h"

namespace fusejit {
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

std::string DumpDir(const CompileOptions& options) {
  if (!options.dump_dir.empty()) return options.dump_dir;
  const char* env = std::getenv("FUSEJIT_DUMP_DIR");
  return env ? env : "";
}

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
  bool operator==(const MemoryKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const MemoryKey& k) {
    return H::combine(std::move(h), k.chain, k.arch, k.sm_count, k.precision, k.strategy,
                      k.dump_dir, k.tune_config, k.use_tuning, k.device, k.driver_version);
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

struct Resolved {
  codegen::PlanTarget target;
  DeviceKey device;  // whose tuned entries apply; empty: none
};

// The arch and SM count to plan for, and the device: the options' arch (and tuning_device), else
// the current context's device (queried once per context).
absl::StatusOr<Resolved> ResolveTarget(const CompileOptions& options) {
  Resolved r;
  codegen::PlanTarget& target = r.target;
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

}  // namespace

const char* GeneratorVersion() { return "fusejit-0.1.0"; }

absl::StatusOr<std::shared_ptr<CompiledChain>> Compile(const Chain& chain,
                                                       const CompileOptions& options) {
  absl::StatusOr<Resolved> resolved = ResolveTarget(options);
  if (!resolved.ok()) return resolved.status();
  const codegen::PlanTarget& target = resolved->target;
  const DeviceKey& device = resolved->device;
  const std::string dump_dir = DumpDir(options);
  MemoryKey memory_key{chain,    target.arch, target.sm_count, options.precision, options.strategy,
                       dump_dir, options.tune_config, options.use_tuning, device.name,
                       device.driver_version};
  if (options.use_cache) {  // a hit was validated when it was stored
    MemoryCache& memory = Memory();
    absl::MutexLock lock(&memory.mu);
    auto it = memory.entries.find(memory_key);
    if (it != memory.entries.end()) {
      cache::KernelCache::Default().RecordMemoryHit();
      return it->second;
    }
  }
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  const std::string spec = FormatChain(chain);

  CompileStats stats;
  auto t0 = std::chrono::steady_clock::now();
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
  } else if (options.use_tuning && !device.empty()) {
    config = tune::TuningDb::Default().Find(chain, target, device);
    if (config.has_value() && !options.strategy.empty() && config->strategy != options.strategy) {
      config.reset();
    }
    if (config.has_value()) stats.tune_origin = "tuned";
  }
  absl::StatusOr<codegen::Plan> plan = config.has_value()
                                           ? codegen::MakePlan(chain, target, *config)
                                           : codegen::MakePlan(chain, target, options.strategy);
  if (!plan.ok()) return plan.status();
  stats.plan_ms = MsSince(t0);

  t0 = std::chrono::steady_clock::now();
  codegen::GeneratedSource source = codegen::EmitSource(chain, *plan);
  std::vector<std::string_view> header_texts;
  for (const auto& h : source.headers) header_texts.push_back(h.second);
  stats.codegen_ms = MsSince(t0);

  // A plan may need an architecture-specific build of the target's arch (sm_90a for wgmma); the
  // compiled chain still reports the target's arch (the device it runs on).
  const std::string arch = plan->arch_override.empty() ? target.arch : plan->arch_override;
  jit::NvrtcRequest request;
  request.name = source.name;
  request.source = source.main;
  request.headers = source.headers;
  request.arch = arch;
  request.options = source.nvrtc_options;
  request.want_ptx = !dump_dir.empty();

  cache::CacheKey key;
  key.source_hash = cache::HashSource(source.main, header_texts);
  key.generator_version = GeneratorVersion();
  key.nvrtc_version = jit::NvrtcVersion();
  key.options = absl::StrJoin(request.options, " ");
  key.arch = arch;
  key.spec = spec;

  std::string ptx;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    absl::StatusOr<jit::NvrtcResult> result = jit::CompileCuda(request);
    if (!result.ok()) {
      // Where the failing source goes when no dump folder was asked for: a new private folder
      // (jit/dump.h), the newest few kept.
      absl::StatusOr<std::string> dir =
          dump_dir.empty() ? jit::NewPrivateDumpDir("failed") : absl::StatusOr<std::string>(dump_dir);
      absl::StatusOr<std::string> path =
          dir.ok() ? DumpSource(*dir, source, key.source_hash, "") : dir.status();
      return absl::Status(result.status().code(),
                          absl::StrCat("compiling ", spec, " (plan ", plan->strategy, "): ",
                                       result.status().message(), "\ngenerated source: ",
                                       path.ok() ? *path : path.status().ToString()));
    }
    stats.nvrtc_ms = result->compile_ms;
    ptx = std::move(result->ptx);
    return std::move(result->cubin);
  };
  absl::StatusOr<std::string> cubin;
  if (options.use_cache && dump_dir.empty()) {
    bool hit = false;
    cubin = cache::KernelCache::Default().GetOrCompile(key, compile, &hit);
    stats.cache_hit = hit;
  } else {
    cubin = compile();
  }
  if (!cubin.ok()) return cubin.status();
  if (!dump_dir.empty()) {
    absl::StatusOr<std::string> path = DumpSource(dump_dir, source, key.source_hash, ptx);
    if (!path.ok()) return path.status();
    stats.source_path = *path;
  }

  auto compiled = std::make_shared<jit::CompiledChainImpl>(
      chain, *std::move(plan), target.arch, std::move(source.main), *std::move(cubin), stats);
  if (options.use_cache) {
    MemoryCache& memory = Memory();
    absl::MutexLock lock(&memory.mu);
    auto [it, inserted] = memory.entries.emplace(std::move(memory_key), compiled);
    return it->second;  // a concurrent compile of the same key may have won; use its instance
  }
  return std::shared_ptr<CompiledChain>(std::move(compiled));
}

}  // namespace fusejit
