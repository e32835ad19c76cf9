// fusejit prewarm MANIFEST: compile a deployment's chains into the kernel cache ahead of time,
// in parallel, without a GPU if need be (tools/prewarm.h does the work, tools/manifest.h reads the
// manifest).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cache/kernel_cache.h"
#include "fmt/format.h"
#include "jit/device.h"
#include "jit/driver.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/manifest.h"
#include "tools/prewarm.h"
#include "tools/progress.h"

namespace fusejit::tools {
namespace {

constexpr size_t kSlowestShown = 5;

int DefaultJobs() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// "sm_80,sm_90" (the flag may be repeated) -> {"sm_80", "sm_90"}, in order, without repeats.
absl::StatusOr<std::vector<std::string>> ParseArchList(const std::vector<std::string>& values) {
  std::vector<std::string> archs;
  for (const std::string& value : values) {
    for (absl::string_view part : absl::StrSplit(value, ',')) {
      const std::string arch(absl::StripAsciiWhitespace(part));
      if (arch.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--arch: empty architecture in '", value, "'; expected a list such as sm_80,sm_90"));
      }
      if (absl::Status s = ValidateArch(arch); !s.ok()) return s;
      if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
    }
  }
  return archs;
}

// "NVIDIA H100 PCIe,114,13000" -> {name, SM count, driver version} (the name may hold commas).
absl::StatusOr<DeviceKey> ParseDevice(const std::string& text) {
  auto error = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device: '", text, "' is not NAME,SMS,DRIVER, e.g. 'NVIDIA H100 80GB HBM3,132,13000' ",
        "(the device as `fusejit autotune` prints it: name, SM count, driver version)"));
  };
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() < 3) return error();
  auto number = [](const std::string& part, int64_t max) -> std::optional<int> {
    absl::StatusOr<int64_t> n =
        ParseIntFlag("device", std::string(absl::StripAsciiWhitespace(part)), 1, max);
    return n.ok() ? std::optional<int>(static_cast<int>(*n)) : std::nullopt;
  };
  const std::optional<int> sms = number(parts[parts.size() - 2], 100000);
  const std::optional<int> driver = number(parts.back(), 10000000);
  parts.resize(parts.size() - 2);
  DeviceKey device;
  device.name = std::string(absl::StripAsciiWhitespace(absl::StrJoin(parts, ",")));
  if (device.name.empty() || !sms || !driver) return error();
  device.sm_count = *sms;
  device.driver_version = *driver;
  return device;
}

// Indents every line after the first, so that a multi-line error (an NVRTC log) stays under its
// heading.
std::string Indent(absl::string_view text, absl::string_view indent) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n')) {
    absl::StrAppend(&out, out.empty() ? "" : absl::StrCat("\n", indent), line);
  }
  return out;
}

std::string FormatMs(double ms) {
  return ms >= 10000 ? fmt::format("{:.1f} s", ms / 1000) : fmt::format("{:.0f} ms", ms);
}

struct Summary {
  size_t compiled = 0, cached = 0, failed = 0;
  double compiled_ms = 0, compiled_max_ms = 0, cached_ms = 0;
  std::map<std::string, size_t> tune_origins;  // CompileStats::tune_origin -> pairs
};

Summary Summarize(const PrewarmReport& report) {
  Summary s;
  for (const PrewarmResult& r : report.results) {
    if (r.compiled != nullptr) ++s.tune_origins[r.compiled->stats().tune_origin];
    switch (r.outcome) {
      case PrewarmOutcome::kCompiled:
        ++s.compiled;
        s.compiled_ms += r.ms;
        s.compiled_max_ms = std::max(s.compiled_max_ms, r.ms);
        break;
      case PrewarmOutcome::kCached:
        ++s.cached;
        s.cached_ms += r.ms;
        break;
      case PrewarmOutcome::kFailed:
        ++s.failed;
        break;
    }
  }
  return s;
}

using Label = std::function<std::string(const PrewarmResult&)>;

void PrintSummary(std::ostream& out, const PrewarmReport& report, const Summary& s,
                  const Manifest& manifest, size_t workers, const Label& label, bool remote) {
  const size_t pairs = report.results.size();
  const size_t failed = s.failed + manifest.invalid_specs;
  const double wall_s = report.wall_ms / 1000;
  out << "\nsummary\n";
  out << fmt::format("  compiled        {}\n", s.compiled);
  out << fmt::format("  already cached  {}\n", s.cached);
  out << fmt::format("  failed          {}", failed);
  if (failed > 0) {
    std::vector<std::string> parts;
    if (manifest.invalid_specs > 0) {
      parts.push_back(fmt::format("{} invalid in the manifest", manifest.invalid_specs));
    }
    if (s.failed > 0) parts.push_back(fmt::format("{} compiles", s.failed));
    out << " (" << absl::StrJoin(parts, ", ") << ")";
  }
  out << "\n";
  out << fmt::format("  wall time       {:.3f} s for {} pairs on {} worker{}: {:.2f} chains/s\n",
                     wall_s, pairs, workers, workers == 1 ? "" : "s",
                     wall_s > 0 ? pairs / wall_s : 0.0);
  if (s.compiled > 0) {
    out << fmt::format(
        "  compile time    mean {}, max {} per chain; sum {:.1f} s ({:.2f}x the wall time)\n",
        FormatMs(s.compiled_ms / s.compiled), FormatMs(s.compiled_max_ms), s.compiled_ms / 1000,
        report.wall_ms > 0 ? s.compiled_ms / report.wall_ms : 0.0);
    std::vector<const PrewarmResult*> slowest;
    for (const PrewarmResult& r : report.results) {
      if (r.outcome == PrewarmOutcome::kCompiled) slowest.push_back(&r);
    }
    const size_t shown = std::min(kSlowestShown, slowest.size());
    std::partial_sort(slowest.begin(), slowest.begin() + shown, slowest.end(),
                      [](const PrewarmResult* a, const PrewarmResult* b) { return a->ms > b->ms; });
    for (size_t i = 0; i < shown; ++i) {
      out << fmt::format("  {:<15} {:>8}  {}\n", i == 0 ? "slowest" : "",
                         FormatMs(slowest[i]->ms), label(*slowest[i]));
    }
  }
  if (s.cached > 0) {
    out << fmt::format("  cache reads     mean {:.1f} ms per already cached chain\n",
                       s.cached_ms / s.cached);
  }
  if (!s.tune_origins.empty()) {  // where each launch configuration came from
    std::vector<std::string> origins;
    for (const auto& [origin, n] : s.tune_origins) {
      origins.push_back(fmt::format("{} {}", n, origin.empty() ? "?" : origin));
    }
    out << fmt::format("  configurations  {}\n", absl::StrJoin(origins, ", "));
  }
  const cache::CacheStats& delta = report.cache_delta;
  out << fmt::format("  cache           {} entries written ({:.1f} MiB)", delta.entries_written,
                     delta.bytes_written / 1048576.0);
  if (delta.evictions > 0) out << fmt::format(", {} evicted", delta.evictions);
  out << "\n";
  if (remote) {
    out << fmt::format("  remote          {} already there, {} published ({:.1f} MiB)",
                       delta.remote_hits, delta.remote_published,
                       delta.remote_bytes_written / 1048576.0);
    if (delta.remote_rejected > 0) {
      out << fmt::format(", {} invalid values replaced", delta.remote_rejected);
    }
    if (delta.remote_errors > 0) out << fmt::format(", {} errors", delta.remote_errors);
    out << "\n";
  }
}

// Notes on what the cache did during the run; returns the problems among them.
std::vector<std::string> CacheProblems(std::ostream& out, const cache::CacheStats& delta,
                                       bool verify, uint64_t max_bytes, bool remote) {
  std::vector<std::string> problems;
  if (remote && (delta.remote_write_failures > 0 || delta.remote_errors > 0)) {
    problems.push_back(fmt::format("the remote cache: {} failed publishes, {} failed calls (see "
                                   "the warnings above)",
                                   delta.remote_write_failures, delta.remote_errors));
  }
  // Every successful compile should have been published; a kernel too large for the limit, a
  // write failure, a refused entry or directory leave it unstored, which defeats the purpose.
  const uint64_t compiled_ok = delta.compiles - delta.compile_failures;
  if (compiled_ok > delta.entries_written) {
    problems.push_back(fmt::format(
        "{} compiled kernels could not be stored in the cache (see the warnings above)",
        compiled_ok - delta.entries_written));
  }
  if (delta.rejected_entries > 0) {
    out << fmt::format("  note: {} invalid cache entries were found and replaced (see the "
                       "warnings above)\n",
                       delta.rejected_entries);
    if (verify) {
      problems.push_back(fmt::format("{} invalid cache entries were found (and replaced)",
                                     delta.rejected_entries));
    }
  }
  if (delta.evictions > 0) {
    out << fmt::format("  note: {} entries were evicted to stay under the cache's limit of {} "
                       "bytes; if they are this manifest's, raise FUSEJIT_CACHE_MAX_BYTES\n",
                       delta.evictions, max_bytes);
  }
  return problems;
}

// --verify: re-reads every entry; loads the modules of device 0's arch when `device` is OK (its
// context current on this thread). Returns the problems.
std::vector<std::string> Verify(std::ostream& out, const PrewarmReport& report,
                                const PrewarmOptions& options, const absl::Status& device,
                                const Label& label) {
  VerifyOptions verify_options;
  std::string load_note;
  if (device.ok()) {
    absl::StatusOr<std::string> arch = jit::CurrentArch();
    if (arch.ok()) {
      verify_options.load_arch = *arch;
    } else {
      load_note = std::string(arch.status().message());
    }
  } else {
    load_note = jit::Driver().ok() ? absl::StrCat("no usable GPU: ", device.message()) : "no GPU";
  }
  const VerifyReport v = VerifyPrewarm(report, options, verify_options, label);
  out << fmt::format("\nverify\n  entries         {} checked, {} ok\n", v.checked, v.ok);
  if (!verify_options.load_arch.empty()) {
    out << fmt::format("  modules         {} loaded on device 0 ({}), {} of other "
                       "architectures not loaded\n",
                       v.loaded, verify_options.load_arch, v.not_loaded);
  } else {
    out << fmt::format("  modules         not loaded ({})\n", load_note);
  }
  std::vector<std::string> problems;
  for (const auto& [what, problem] : v.problems) {
    problems.push_back(fmt::format("{}: {}", what, problem));
  }
  return problems;
}

void PrintFailures(std::ostream& out, const PrewarmReport& report, const Manifest& manifest,
                   const Label& label) {
  out << "\nfailed\n";
  for (const std::string& e : manifest.errors) out << "  " << Indent(e, "    ") << "\n";
  for (const PrewarmResult& r : report.results) {
    if (r.outcome != PrewarmOutcome::kFailed) continue;
    out << fmt::format("  {}: {}\n", label(r), Indent(r.error, "    "));
  }
}

}  // namespace

const CommandSpec& PrewarmSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit prewarm",
      .positional = "MANIFEST",
      .min_positional = 1,
      .max_positional = 1,
      .summary = "compile a manifest's chains into the kernel cache ahead of time (no GPU needed)",
      .description =
          "MANIFEST lists the chains a deployment will run, one spec per line; '#' starts a\n"
          "comment; a grid {a,b,c} anywhere in a line expands it to one spec per value (several\n"
          "grids: their cross product), e.g.\n"
          "  x:f32[{1,8,32},3,16,32,32] | conv3d(out=16,k=3) | relu     # 3 specs\n"
          "Every (spec, architecture) pair is compiled on --jobs threads exactly as a later\n"
          "run would ask for it (fusejit::Compile with that arch), so that run finds it in the\n"
          "cache; pairs already cached are only read. Without --arch: device 0's architecture\n"
          "when a GPU is present (compiled as a run on it with no arch asks), else sm_90. With\n"
          "--arch, chains are planned for a 132-SM device without tuned entries, as a run passing\n"
          "that arch gets them; to match runs on a GPU this machine lacks (which plan for its SM\n"
          "count and use `fusejit autotune`'s entries for it, stored beside the cache), name it\n"
          "with --device NAME,SMS,DRIVER.\n"
          "Progress goes to stderr (a bar on a terminal); the summary to stdout. Exit status 1\n"
          "if any spec or compile failed (the others are still compiled), a compiled kernel\n"
          "could not be stored, or --verify found a problem.\n",
      .flags = {{"arch", "sm_XX,...",
                 "architectures, comma-separated (default: device 0's, else sm_90)",
                 /*repeated=*/true},
                {"jobs", "N", "parallel compiles (default: the number of cores)"},
                {"cache-dir", "DIR", "the kernel cache directory (default: as FUSEJIT_CACHE_DIR)"},
                {"precision", "fp32|tf32", "the precision runs will ask for (default fp32)"},
                {"device", "NAME,SMS,DRIVER",
                 "with one --arch: the GPU runs will use (its SM count, its tuned entries)"},
                {"verify", "",
                 "then re-read each entry (checksum, key); on a GPU also load each module"},
                {"remote", "",
                 "fill the remote cache (FUSEJIT_REMOTE_CACHE) too: publish what it lacks, "
                 "report what it had"},
                {"list", "", "print the manifest's chains (canonical specs) and errors; compile "
                             "nothing"}},
  };
  return *spec;
}

int PrewarmCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = PrewarmSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  absl::StatusOr<std::vector<std::string>> archs = ParseArchList(parsed->GetAll("arch"));
  if (!archs.ok()) return UsageError(err, spec, archs.status().message());
  int jobs = DefaultJobs();
  if (auto v = parsed->Get("jobs")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("jobs", *v, 1, 1024);
    if (!n.ok()) return UsageError(err, spec, n.status().message());
    jobs = static_cast<int>(*n);
  }
  PrewarmOptions options;
  options.jobs = jobs;
  const std::string precision = parsed->Get("precision").value_or("fp32");
  if (precision == "tf32") {
    options.compile.precision = Precision::kTf32;
  } else if (precision != "fp32") {
    return UsageError(err, spec,
                      absl::StrCat("--precision ", precision, ": expected fp32 or tf32"));
  }
  const bool verify = parsed->Has("verify");
  if (auto text = parsed->Get("device")) {
    absl::StatusOr<DeviceKey> device = ParseDevice(*text);
    if (!device.ok()) return UsageError(err, spec, device.status().message());
    if (archs->size() != 1) {
      return UsageError(err, spec, "--device needs exactly one --arch (the device's architecture)");
    }
    options.compile.tuning_device = *device;
  }

  // The cache directory: the default cache reads FUSEJIT_CACHE_DIR when first used, which is
  // below (nothing in this process has used it yet).
  std::optional<std::filesystem::path> cache_dir;
  if (auto dir = parsed->Get("cache-dir")) {
    if (dir->empty()) return UsageError(err, spec, "--cache-dir: the directory name is empty");
    std::error_code ec;
    cache_dir = std::filesystem::absolute(*dir, ec);
    if (ec) return UsageError(err, spec, absl::StrCat("--cache-dir ", *dir, ": ", ec.message()));
    if (setenv("FUSEJIT_CACHE_DIR", cache_dir->c_str(), /*overwrite=*/1) != 0) {
      return Failure(err, spec, "cannot set FUSEJIT_CACHE_DIR");
    }
  }

  // A refused FUSEJIT_DUMP_DIR would fail every compile: refuse it once, as invalid input.
  if (absl::StatusOr<std::string> dump = DumpDirFromFlags(*parsed); !dump.ok()) {
    return InputError(err, spec, dump.status());
  }

  const std::string& manifest_path = parsed->positional[0];
  absl::StatusOr<Manifest> manifest = ReadManifest(manifest_path);
  if (!manifest.ok()) return InputError(err, spec, manifest.status());
  if (parsed->Has("list")) {
    for (const ManifestEntry& e : manifest->entries) out << e.spec << "\n";
    for (const std::string& e : manifest->errors) err << e << "\n";
    out << fmt::format("# {}: {} specs, {} chains, {} duplicates, {} invalid\n", manifest_path,
                       manifest->specs, manifest->entries.size(), manifest->duplicates,
                       manifest->invalid_specs);
    return manifest->errors.empty() ? kExitOk : kExitUsage;
  }

  // Targets. Without --arch: the device (its context is held on this thread for --verify's
  // loads; workers make it current on theirs), else sm_90.
  CompileTarget device_target;
  if (archs->empty()) {
    device_target = ChooseCompileTarget("");
    if (!device_target.note.empty()) err << device_target.note << "\n";
    if (device_target.context.has_value()) {
      absl::StatusOr<std::string> arch = jit::CurrentArch();
      if (!arch.ok()) return Failure(err, spec, arch.status().message());
      options.targets.push_back({"", *arch});
    } else {
      options.targets.push_back({device_target.arch, device_target.arch});
    }
  } else {
    for (const std::string& arch : *archs) options.targets.push_back({arch, arch});
  }

  cache::KernelCache& cache = cache::KernelCache::Default();
  const bool remote = parsed->Has("remote");
  if (remote) {
    if (!cache.remote_configured()) {
      return Failure(err, spec, absl::StrCat("--remote: no remote cache; set FUSEJIT_REMOTE_CACHE ",
                                             "to ", std::string(cache::kRemoteUrlForms)));
    }
    if (cache.options().remote->read_only) {
      return Failure(err, spec, "--remote: FUSEJIT_REMOTE_CACHE_READONLY is set: nothing would "
                                "be published");
    }
    if (absl::Status s = cache.RemotePing(); !s.ok()) {
      return Failure(err, spec, absl::StrCat("--remote: ", cache.remote_description(),
                                             " does not answer: ", s.message()));
    }
    cache.set_remote_fill(true);
  }
  if (!cache.disk_usable()) {
    return Failure(err, spec,
                   absl::StrCat("the kernel cache is not usable (", cache.disk_status(),
                                "); prewarming needs a writable cache directory: give "
                                "--cache-dir DIR or set FUSEJIT_CACHE_DIR"));
  }
  if (cache_dir.has_value()) {
    std::error_code ec;
    if (!std::filesystem::equivalent(*cache_dir, cache.directory(), ec)) {
      return Failure(err, spec, absl::StrCat("the kernel cache was already set up for ",
                                             cache.directory(), ", not ", cache_dir->string()));
    }
  }

  std::vector<Chain> chains;
  for (const ManifestEntry& e : manifest->entries) chains.push_back(e.chain);
  std::vector<std::string> labels;
  for (const PrewarmTarget& t : options.targets) labels.push_back(t.label);
  const size_t pairs = chains.size() * options.targets.size();
  const size_t workers = std::min<size_t>(jobs, std::max<size_t>(pairs, 1));
  std::string counts = absl::StrCat(manifest->specs, " specs");
  if (manifest->duplicates > 0 || manifest->invalid_specs > 0) {
    std::vector<std::string> notes;
    if (manifest->duplicates > 0) {
      notes.push_back(absl::StrCat(manifest->duplicates, " duplicate"));
    }
    if (manifest->invalid_specs > 0) {
      notes.push_back(absl::StrCat(manifest->invalid_specs, " invalid"));
    }
    absl::StrAppend(&counts, " (", absl::StrJoin(notes, ", "), ")");
  }
  out << fmt::format("prewarm: {}: {} -> {} chains x {} ({}) = {} pairs on {} worker{}\n",
                     manifest_path, counts, chains.size(),
                     options.targets.size() == 1 ? "1 architecture"
                                                 : fmt::format("{} architectures",
                                                               options.targets.size()),
                     absl::StrJoin(labels, ", "), pairs, workers, workers == 1 ? "" : "s");
  const DeviceKey& device = options.compile.tuning_device;
  if (!device.empty()) {
    out << fmt::format("device:  {} ({} SMs, driver {}): planned and tuned as on it\n", device.name,
                       device.sm_count, device.driver_version);
  }
  out << fmt::format("cache:   {}\n", cache.directory());
  if (remote) out << fmt::format("remote:  {}\n", cache.remote_description());
  out.flush();
  if (chains.empty() && manifest->errors.empty()) {
    return UsageError(err, spec, absl::StrCat(manifest_path, " names no specs"));
  }
  if (!manifest->errors.empty()) {
    err << fmt::format("prewarm: {} specs of {} have errors (listed at the end); compiling the "
                       "others\n",
                       manifest->invalid_specs, manifest_path);
  }

  const Label label = [&](const PrewarmResult& r) {
    return fmt::format("{} {} ({})", labels[r.target], manifest->entries[r.chain].spec,
                       manifest->entries[r.chain].location);
  };
  Progress progress(err, Progress::StyleFor(err), "prewarm", pairs);
  options.on_done = [&](const PrewarmResult& r) {
    const bool failed = r.outcome == PrewarmOutcome::kFailed;
    if (failed) {
      const std::string first = r.error.substr(0, r.error.find('\n'));
      progress.Note(fmt::format("failed: {}: {}", label(r), first));
    }
    progress.Done(failed);
  };
  const PrewarmReport report = RunPrewarm(chains, options);
  progress.Finish();

  const Summary summary = Summarize(report);
  const size_t failed = summary.failed + manifest->invalid_specs;
  PrintSummary(out, report, summary, *manifest, workers, label, remote);
  std::vector<std::string> problems = CacheProblems(out, report.cache_delta, verify,
                                                    cache.max_bytes(), remote);
  if (verify) {
    // Modules load on device 0: the one held for compiling without --arch, else one made now.
    std::optional<jit::ScopedPrimaryContext> context;
    absl::Status device = absl::OkStatus();
    if (!device_target.context.has_value()) {
      absl::StatusOr<jit::ScopedPrimaryContext> created = jit::ScopedPrimaryContext::Create(0);
      if (created.ok()) {
        context.emplace(*std::move(created));
      } else {
        device = created.status();
      }
    }
    std::vector<std::string> more = Verify(out, report, options, device, label);
    problems.insert(problems.end(), more.begin(), more.end());
  }
  if (failed > 0) PrintFailures(out, report, *manifest, label);
  if (!problems.empty()) {
    out << "\nproblems\n";
    for (const std::string& p : problems) out << "  " << Indent(p, "    ") << "\n";
  }
  out.flush();
  if (failed == 0 && problems.empty()) return kExitOk;
  std::vector<std::string> what;
  if (manifest->invalid_specs > 0) {
    what.push_back(fmt::format("{} invalid specs", manifest->invalid_specs));
  }
  if (summary.failed > 0) {
    what.push_back(fmt::format("{} of {} compiles failed", summary.failed, report.results.size()));
  }
  if (!problems.empty()) what.push_back(fmt::format("{} problems", problems.size()));
  err << fmt::format("{}: error: {} (see the summary)\n", spec.name, absl::StrJoin(what, ", "));
  // Invalid specs are invalid input (2) even when every valid one compiled; else a failure (1).
  return manifest->invalid_specs > 0 ? kExitUsage : kExitFailure;
}

}  // namespace fusejit::tools
