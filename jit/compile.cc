// fusejit::Compile: chain -> plan -> source -> cubin (NVRTC or the kernel cache) -> CompiledChain.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <filesystem>

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
#include "jit/nvrtc.h"

namespace fusejit {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Writes the generated source (and templates, so `nvcc -I DIR/templates FILE` compiles it) below
// `dir`. Returns the path of the main file. Best effort: an error is returned, never thrown.
absl::StatusOr<std::string> DumpSource(const std::string& dir, const codegen::GeneratedSource& src,
                                       const std::string& hash, const std::string& ptx) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "templates", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  auto write = [](const fs::path& path, const std::string& text) -> absl::Status {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
    return absl::OkStatus();
  };
  for (const auto& [name, text] : src.headers) {
    if (absl::Status s = write(fs::path(dir) / "templates" / name, text); !s.ok()) return s;
  }
  const std::string stem = absl::StrCat(src.name.substr(0, src.name.size() - 3), "_",
                                        hash.substr(0, 12));
  const fs::path main = fs::path(dir) / (stem + ".cu");
  if (absl::Status s = write(main, src.main); !s.ok()) return s;
  if (!ptx.empty()) {
    if (absl::Status s = write(fs::path(dir) / (stem + ".ptx"), ptx); !s.ok()) return s;
  }
  return main.string();
}

std::string DumpDir(const CompileOptions& options) {
  if (!options.dump_dir.empty()) return options.dump_dir;
  const char* env = std::getenv("FUSEJIT_DUMP_DIR");
  return env ? env : "";
}

// Where a failing source goes when no dump directory was asked for.
std::string FailureDumpDir() {
  return (std::filesystem::temp_directory_path() / "fusejit-failed").string();
}

struct MemoryCache {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<CompiledChain>> entries ABSL_GUARDED_BY(mu);
};

MemoryCache& Memory() {
  static auto* cache = new MemoryCache();
  return *cache;
}

}  // namespace

const char* GeneratorVersion() { return "fusejit-0.1.0"; }

absl::StatusOr<std::shared_ptr<CompiledChain>> Compile(const Chain& chain,
                                                       const CompileOptions& options) {
  if (absl::Status s = ValidateChain(chain); !s.ok()) return s;
  codegen::PlanTarget target;
  target.precision = options.precision;
  target.arch = options.arch;
  if (target.arch.empty()) {
    absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();
    if (!device.ok()) {
      return absl::Status(device.status().code(),
                          absl::StrCat("compiling for the current device: ",
                                       device.status().message(),
                                       " (give an explicit arch such as sm_90 to compile without "
                                       "a GPU)"));
    }
    target.arch = device->arch;
    target.sm_count = device->sm_count;
  }
  const std::string spec = FormatChain(chain);
  const std::string dump_dir = DumpDir(options);
  const std::string memory_key =
      absl::StrCat(spec, "|", target.arch, "|", target.sm_count, "|",
                   static_cast<int>(options.precision), "|", options.strategy, "|", dump_dir);
  if (options.use_cache) {
    MemoryCache& memory = Memory();
    absl::MutexLock lock(&memory.mu);
    auto it = memory.entries.find(memory_key);
    if (it != memory.entries.end()) {
      cache::KernelCache::Default().RecordMemoryHit();
      return it->second;
    }
  }

  CompileStats stats;
  auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, target, options.strategy);
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
      const std::string dir = dump_dir.empty() ? FailureDumpDir() : dump_dir;
      absl::StatusOr<std::string> path = DumpSource(dir, source, key.source_hash, "");
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
    auto [it, inserted] = memory.entries.emplace(memory_key, compiled);
    return it->second;  // a concurrent compile of the same key may have won; use its instance
  }
  return std::shared_ptr<CompiledChain>(std::move(compiled));
}

}  // namespace fusejit
