// fusejit seeds: the main job. Each seed chain (include/fusejit/workloads.h) is compiled, run on
// random data and checked against the CPU reference on a GPU; without one, compiled for sm_90.
#include <chrono>

#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "fusejit/workloads.h"
#include "jit/device.h"
#include "jit/driver.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/runner.h"

namespace fusejit::tools {
namespace {

constexpr char kNoGpuArch[] = "sm_90";

struct SeedsFlags {
  int64_t check_samples = 2;
  int64_t reps = 10;
  bool use_cache = true;
};

absl::Status ParseSeedsFlags(const ParsedArgs& parsed, SeedsFlags& flags) {
  if (auto v = parsed.Get("check-samples")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("check-samples", *v, 1, INT64_MAX);
    if (!n.ok()) return n.status();
    flags.check_samples = *n;
  }
  if (auto v = parsed.Get("reps")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("reps", *v, 1, 100000);
    if (!n.ok()) return n.status();
    flags.reps = *n;
  }
  flags.use_cache = !parsed.Has("no-cache");
  return absl::OkStatus();
}

// Compiles `w` and reports the wall time of Compile.
struct Compiled {
  absl::StatusOr<std::shared_ptr<CompiledChain>> chain;
  double ms = 0;
};
Compiled CompileTimed(const Chain& chain, const CompileOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Compiled c{Compile(chain, options)};
  c.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

const char* CacheWord(const CompiledChain& c, bool use_cache) {
  return !use_cache ? "off" : (c.stats().cache_hit ? "hit" : "miss");
}

// No driver: compile each chain for sm_90 and print the compile times.
int CompileOnly(const CommandSpec& spec, const SeedsFlags& flags, const absl::Status& why,
                std::ostream& out, std::ostream& err) {
  out << fmt::format("{}\ncompiling the seed chains for {} only.\n\n", std::string(why.message()),
                     kNoGpuArch);
  out << fmt::format("{:<3} {:<19} {:<6} {:<24} {:>11} {:>9} {:<5} {:>9}  {}\n", "id", "output",
                     "arch", "plan", "compile ms", "NVRTC ms", "cache", "cubin B", "spec");
  int failures = 0;
  for (const Workload& w : SeedWorkloads()) {
    absl::StatusOr<Chain> chain = ParseChain(w.spec);
    if (!chain.ok()) {
      ++failures;
      err << fmt::format("{}: {}: {}\n", spec.name, w.id, std::string(chain.status().message()));
      continue;
    }
    CompileOptions options;
    options.arch = kNoGpuArch;
    options.use_cache = flags.use_cache;
    Compiled c = CompileTimed(*chain, options);
    if (!c.chain.ok()) {
      ++failures;
      out << fmt::format("{:<3} {:<19} {:<6} COMPILE FAILED (see stderr)\n", w.id,
                         FormatShape(OutputShape(*chain)), kNoGpuArch);
      err << fmt::format("{}: {}: {}\n", spec.name, w.id, std::string(c.chain.status().message()));
      continue;
    }
    const CompiledChain& cc = **c.chain;
    const std::string nvrtc_ms =
        cc.stats().cache_hit ? "-" : fmt::format("{:.1f}", cc.stats().nvrtc_ms);
    out << fmt::format("{:<3} {:<19} {:<6} {:<24} {:>11.1f} {:>9} {:<5} {:>9}  {}\n", w.id,
                       FormatShape(cc.output_shape()), cc.arch(), Inspect(cc).strategy, c.ms,
                       nvrtc_ms, CacheWord(cc, flags.use_cache), Inspect(cc).cubin_bytes, w.spec);
    out.flush();
  }
  out << "\nlaunching needs an NVIDIA GPU and its driver: the seed chains were compiled for "
      << kNoGpuArch << ", not run or checked.\n";
  return failures == 0 ? kExitOk : kExitFailure;
}

// One seed chain on the GPU: compile, run on random data, check. Prints its table row.
bool RunOne(const Workload& w, const SeedsFlags& flags, const CommandSpec& spec, std::ostream& out,
            std::ostream& err) {
  auto fail = [&](const char* stage, const absl::Status& s) {
    out << fmt::format("{:<3} FAIL ({} failed, see stderr)  {}\n", w.id, stage, w.spec);
    err << fmt::format("{}: {}: {}: {}\n", spec.name, w.id, stage, std::string(s.message()));
    return false;
  };
  absl::StatusOr<Chain> chain = ParseChain(w.spec);
  if (!chain.ok()) return fail("parse", chain.status());
  CompileOptions options;  // arch empty: the current device's
  options.use_cache = flags.use_cache;
  Compiled c = CompileTimed(*chain, options);
  if (!c.chain.ok()) return fail("compile", c.chain.status());
  // Random x, conv weights and GroupNorm weight/bias (never 1/0, which hides bugs).
  const HostInputs inputs = RandomInputs(*chain, 0);
  absl::StatusOr<DeviceRunResult> run =
      RunOnDevice(**c.chain, inputs, {.reps = static_cast<int>(flags.reps)});
  if (!run.ok()) return fail("run", run.status());
  absl::StatusOr<CheckResult> check =
      CheckOutput(*chain, inputs, run->output, {.samples = flags.check_samples});
  if (!check.ok()) return fail("check", check.status());
  out << fmt::format("{:<3} {:<19} {:>11.1f} {:<5} {:>10.4f} {:>11.3e} {:>10.3e} {:>9} {:<6} {}\n",
                     w.id, FormatShape(run->output.shape), c.ms,
                     CacheWord(**c.chain, flags.use_cache), run->median_ms, check->errors.max_abs,
                     check->errors.rel_l2, check->unwritten, check->pass ? "PASS" : "FAIL", w.spec);
  out.flush();
  return check->pass;
}

}  // namespace

const CommandSpec& SeedsSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit seeds",
      .summary = "the four seed chains: run and checked on a GPU, compiled for sm_90 without one",
      .description =
          "With a GPU (device 0): compiles each seed chain, runs it on random data (x, conv\n"
          "weights, GroupNorm weight and bias), times --reps runs (median), checks the output\n"
          "against the float64 CPU reference on --check-samples samples (first and last\n"
          "included) and prints one row per chain; exit 1 if any fails (relative L2 error\n"
          "above 1e-5, max abs error above 1e-4, or unwritten outputs).\n"
          "Without a GPU: compiles each chain for sm_90 and prints the compile times.\n"
          "--list prints the seed specs (canonical), one per line, and does nothing else.\n",
      .flags =
          {
              {"check-samples", "K", "samples compared with the reference (default 2)"},
              {"reps", "N", "timed runs per chain (default 10)"},
              NoCacheFlag(),
              {"list", "", "print the seed specs, one per line; run nothing"},
          },
  };
  return *spec;
}

int SeedsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = SeedsSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  SeedsFlags flags;
  if (absl::Status s = ParseSeedsFlags(*parsed, flags); !s.ok()) {
    return UsageError(err, spec, s.message());
  }
  if (parsed->Has("list")) {  // for scripts (scripts/gpu-sanitize.sh)
    for (const Workload& w : SeedWorkloads()) {
      absl::StatusOr<Chain> chain = ParseChain(w.spec);
      if (!chain.ok()) return Failure(err, spec, chain.status().message());
      out << FormatChain(*chain) << "\n";
    }
    return kExitOk;
  }

  absl::StatusOr<const jit::DriverApi*> driver = jit::Driver();
  if (!driver.ok()) return CompileOnly(spec, flags, driver.status(), out, err);
  absl::StatusOr<jit::ScopedPrimaryContext> context = jit::ScopedPrimaryContext::Create(0);
  if (!context.ok()) return Failure(err, spec, context.status().message());
  absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();
  if (!device.ok()) return Failure(err, spec, device.status().message());
  out << fmt::format("device 0: {} ({}, {} SMs), driver {}.{}\n", device->name, device->arch,
                     device->sm_count, device->driver_version / 1000,
                     device->driver_version % 1000 / 10);
  out << fmt::format(
      "checking {} sample(s) per chain against the float64 CPU reference; run time "
      "is the median of {} runs\n\n",
      flags.check_samples, flags.reps);
  out << fmt::format("{:<3} {:<19} {:>11} {:<5} {:>10} {:>11} {:>10} {:>9} {:<6} {}\n", "id",
                     "output", "compile ms", "cache", "run ms", "max abs err", "rel err",
                     "unwritten", "result", "spec");
  int passed = 0;
  const auto& seeds = SeedWorkloads();
  for (const Workload& w : seeds) passed += RunOne(w, flags, spec, out, err) ? 1 : 0;
  out << fmt::format("\n{}/{} seed chains passed\n", passed, seeds.size());
  return passed == static_cast<int>(seeds.size()) ? kExitOk : kExitFailure;
}

}  // namespace fusejit::tools
