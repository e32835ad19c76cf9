// fusejit bench SPEC: the median CUDA-event time of a chain, with the L2 cache flushed before every
// timed run, and how close it comes to the memory and arithmetic floors.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "jit/device.h"
#include "reference/npy.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/runner.h"
#include "tools/tensor_files.h"

namespace fusejit::tools {
namespace {

// The floors of ../shared/WORKLOADS.md: the H100's measured copy bandwidth and fp32 FFMA peak.
constexpr double kMemoryBytesPerSecond = 3.02e12;
constexpr double kFp32FlopsPerSecond = 67e12;
constexpr size_t kL2FlushBytes = 256u << 20;

struct Work {
  double bytes = 0;  // x, parameters and y, each moved once
  double flops = 0;  // the producer's multiply-adds x 2
};

Work CountWork(const Chain& chain) {
  const codegen::ChainInfo info = codegen::AnalyzeChain(chain);
  Work w;
  w.bytes = 4.0 * static_cast<double>(NumElements(chain.input) + NumElements(OutputShape(chain)));
  for (const ParamSpec& p : ChainParams(chain)) w.bytes += 4.0 * static_cast<double>(NumElements(p.shape));
  w.flops = 2.0 * info.macs_per_point * static_cast<double>(info.elements);
  return w;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

const CommandSpec& BenchSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit bench",
      .positional = "SPEC",
      .min_positional = 1,
      .max_positional = 1,
      .summary = "time a chain on the GPU (median of CUDA-event timings, L2 flushed)",
      .description =
          "Compiles and runs the chain on device 0 on random data (or the given .npy files),\n"
          "then times --reps runs after --warmup untimed ones. Before every run (timed or not)\n"
          "a 256 MB buffer is overwritten outside the timed events, so no run finds its inputs\n"
          "in the L2 cache. Prints the median and minimum time, the achieved bandwidth (x,\n"
          "parameters and y moved once) and FLOP rate (the producer's multiply-adds), and the\n"
          "fraction of the memory floor (3.02 TB/s) and fp32 FFMA floor (67 TFLOP/s) reached:\n"
          "the H100 figures of WORKLOADS.md. --json prints one JSON object instead.\n",
      .flags =
          {
              {"reps", "N", "timed runs (default 50)"},
              {"warmup", "N", "untimed runs before them (default 5)"},
              {"json", "", "print one JSON object (median_ms, ...) instead of text"},
              {"kernels", "", "also time each kernel of the plan (differences of prefix medians)"},
              {"grad", "",
               "time the training step: the forward, then the backward from a random grad_y; "
               "where the chain has a convolution's output to save, the training forward "
               "(CompileTrainingForward) and the backward reading it; --kernels then times the "
               "backward's kernels"},
              {"recompute", "",
               "with --grad: the plain forward and the backward that recomputes the convolution "
               "(CompileBackward) instead"},
              PrecisionFlag(),
              {"input", "FILE.npy", "the input x (default: random)"},
              {"param", "NAME=FILE.npy", "a parameter, e.g. 0.weight=w.npy (default: random)",
               /*repeated=*/true},
              {"output", "FILE.npy", "write the output of the first run here"},
              {"seed", "N", "seed of the random tensors (default 0)"},
              StrategyFlag(),
              ConfigFlag(),
          },
  };
  return *spec;
}

// `, "kernels": [{"name": ..., "median_ms": ...}, ...]` or "" when there are none.
std::string KernelsJson(const std::vector<KernelTime>& kernels) {
  if (kernels.empty()) return "";
  std::string out = ", \"kernels\": [";
  for (size_t i = 0; i < kernels.size(); ++i) {
    out += fmt::format("{}{{\"name\": {}, \"median_ms\": {:.6f}}}", i ? ", " : "",
                       JsonString(kernels[i].name), kernels[i].median_ms);
  }
  return out + "]";
}

// The training step: forward and backward timed separately (each median over `reps`, L2 flushed),
// their sum the step.
int BenchGrad(const Chain& chain, const CompileOptions& options, const HostInputs& inputs,
              uint64_t seed, int64_t reps, int64_t warmup, bool kernels, bool json, bool recompute,
              const std::string& device, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = BenchSpec();
  const auto t0 = std::chrono::steady_clock::now();
  const bool saves = !recompute && TrainingForwardSaves(chain, options);
  absl::StatusOr<std::shared_ptr<CompiledChain>> forward =
      saves ? CompileTrainingForward(chain, options) : Compile(chain, options);
  if (!forward.ok()) return Failure(err, spec, forward.status().message());
  absl::StatusOr<std::shared_ptr<CompiledChain>> backward =
      saves ? CompileBackwardFromSaved(chain, options) : CompileBackward(chain, options);
  if (!backward.ok()) return Failure(err, spec, backward.status().message());
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::map<std::string, HostTensor> reads = inputs.params;
  reads[std::string(kInputName)] = inputs.x;
  reads[std::string(kGradOutputName)] = RandomGradOutput(chain, seed);
  DeviceRunOptions run_options;
  run_options.reps = static_cast<int>(reps);
  run_options.warmup = static_cast<int>(warmup);
  run_options.l2_flush_bytes = kL2FlushBytes;
  absl::StatusOr<SignatureRunResult> f = RunSignatureOnDevice(**forward, reads, run_options);
  if (!f.ok()) return Failure(err, spec, f.status().message());
  // Every tensor the training forward saved (u, and the group statistics where its plan saves
  // them), held from the forward to the backward, which reads them.
  size_t saved_bytes = 0;
  for (const TensorSpec& t : (*forward)->signature()) {
    if (t.role != TensorRole::kSaved) continue;
    reads[t.name] = f->written.at(t.name);
    saved_bytes += t.bytes();
  }
  run_options.per_kernel = kernels;
  absl::StatusOr<SignatureRunResult> b = RunSignatureOnDevice(**backward, reads, run_options);
  if (!b.ok()) return Failure(err, spec, b.status().message());
  const size_t extra = (*backward)->workspace_bytes();
  if (json) {
    out << fmt::format(
        "{{\"spec\": {}, \"device\": {}, \"forward_ms\": {:.6f}, \"backward_ms\": {:.6f}, "
        "\"step_ms\": {:.6f}, \"reps\": {}, \"compile_ms\": {:.3f}, "
        "\"backward_workspace_bytes\": {}, \"saved_bytes\": {}{}}}\n",
        JsonString(FormatChain(chain)), JsonString(device), f->median_ms, b->median_ms,
        f->median_ms + b->median_ms, reps, compile_ms, extra, saved_bytes, KernelsJson(b->kernels));
    return kExitOk;
  }
  out << fmt::format("chain:      {}\n", FormatChain(chain));
  out << fmt::format("device:     {}, forward plan {}\n", device, (*forward)->strategy());
  out << fmt::format(
      "forward:    {:.4f} ms median of {} runs (L2 flushed){}\n", f->median_ms, reps,
      saves ? fmt::format(", saving u{} ({:.1f} MB) for the backward",
                          reads.count(std::string(codegen::kSavedStatsName)) > 0
                              ? " and the group statistics"
                              : "",
                          saved_bytes * 1e-6)
            : std::string(recompute ? ", the backward recomputes u" : ""));
  out << fmt::format("backward:   {:.4f} ms median ({} kernels, workspace {:.1f} MB)\n",
                     b->median_ms, (*backward)->kernel_count(), extra * 1e-6);
  out << fmt::format("step:       {:.4f} ms (forward + backward)\n", f->median_ms + b->median_ms);
  for (const KernelTime& k : b->kernels) {
    out << fmt::format("  kernel {:<24} {:.4f} ms ({:.0f}%)\n", k.name, k.median_ms,
                       100 * k.median_ms / b->median_ms);
  }
  return kExitOk;
}

int BenchCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = BenchSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  absl::StatusOr<Chain> chain = ParseChain(parsed->positional[0]);
  if (!chain.ok()) return UsageError(err, spec, chain.status().message());

  int64_t reps = 50, warmup = 5, seed = 0;
  for (auto [flag, target, lo] : {std::tuple{"reps", &reps, 1}, std::tuple{"warmup", &warmup, 0},
                                  std::tuple{"seed", &seed, 0}}) {
    if (auto v = parsed->Get(flag)) {
      absl::StatusOr<int64_t> n = ParseIntFlag(flag, *v, lo, 1000000);
      if (!n.ok()) return UsageError(err, spec, n.status().message());
      *target = *n;
    }
  }
  absl::StatusOr<CompileOptions> flag_options = CompileOptionsFromFlags(*parsed);
  if (!flag_options.ok()) return UsageError(err, spec, flag_options.status().message());
  CompileOptions options = *flag_options;
  const std::string precision = parsed->Get("precision").value_or("fp32");  // for the report
  absl::StatusOr<TensorFiles> files = ParseTensorFlags(*parsed, *chain);
  if (!files.ok()) return UsageError(err, spec, files.status().message());
  if (absl::Status s = CheckPlannable(*chain, "", options.strategy); !s.ok()) {
    return UsageError(err, spec, s.message());
  }
  HostInputs given;
  if (absl::Status s = ReadTensorFiles(*files, *chain, given); !s.ok()) {
    return InputError(err, spec, s);  // 2 for a bad file, 1 for an I/O error
  }

  absl::StatusOr<jit::ScopedPrimaryContext> context = jit::ScopedPrimaryContext::Create(0);
  if (!context.ok()) return Failure(err, spec, context.status().message());
  absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();
  if (!device.ok()) return Failure(err, spec, device.status().message());

  const auto t0 = std::chrono::steady_clock::now();
  if (parsed->Has("grad")) {
    if (!options.strategy.empty()) {
      return UsageError(err, spec, "--strategy names a forward plan; leave it out with --grad");
    }
    if (!options.tune_config.empty()) {
      return UsageError(err, spec,
                        "--config names a forward plan's tuning; leave it out with --grad");
    }
    return BenchGrad(*chain, options,
                     InputsWith(*chain, static_cast<uint64_t>(seed), std::move(given)),
                     static_cast<uint64_t>(seed), reps, warmup, parsed->Has("kernels"),
                     parsed->Has("json"), parsed->Has("recompute"), device->name, out, err);
  }
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(*chain, options);
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());

  const HostInputs inputs = InputsWith(*chain, static_cast<uint64_t>(seed), std::move(given));
  DeviceRunOptions run_options;
  run_options.reps = static_cast<int>(reps);
  run_options.warmup = static_cast<int>(warmup);
  run_options.l2_flush_bytes = kL2FlushBytes;
  run_options.per_kernel = parsed->Has("kernels");
  absl::StatusOr<DeviceRunResult> run = RunOnDevice(**compiled, inputs, run_options);
  if (!run.ok()) return Failure(err, spec, run.status().message());
  if (auto path = parsed->Get("output")) {
    if (absl::Status s = WriteNpy(*path, run->output); !s.ok()) {
      return Failure(err, spec, absl::StrCat("--output: ", s.message()));
    }
  }

  const Work work = CountWork(*chain);
  const double median_s = run->median_ms * 1e-3;
  double min_ms = run->times_ms[0];
  for (float t : run->times_ms) min_ms = std::min<double>(min_ms, t);
  const double memory_floor_ms = work.bytes / kMemoryBytesPerSecond * 1e3;
  const double flop_floor_ms = work.flops / kFp32FlopsPerSecond * 1e3;
  const std::string strategy = Inspect(**compiled).strategy;
  if (parsed->Has("json")) {
    out << fmt::format(
        "{{\"spec\": {}, \"strategy\": {}, \"precision\": {}, \"device\": {}, \"median_ms\": {:.6f}, "
        "\"min_ms\": {:.6f}, \"reps\": {}, \"compile_ms\": {:.3f}, \"gb_per_s\": {:.2f}, "
        "\"tflop_per_s\": {:.3f}, \"memory_floor_ms\": {:.6f}, \"flop_floor_ms\": {:.6f}, "
        "\"fraction_of_memory_floor\": {:.4f}, \"fraction_of_flop_floor\": {:.4f}{}}}\n",
        JsonString(FormatChain(*chain)), JsonString(strategy), JsonString(precision),
        JsonString(device->name), run->median_ms, min_ms, reps, compile_ms,
        work.bytes / median_s * 1e-9, work.flops / median_s * 1e-12, memory_floor_ms,
        flop_floor_ms, memory_floor_ms / run->median_ms, flop_floor_ms / run->median_ms,
        KernelsJson(run->kernels));
    return kExitOk;
  }
  out << fmt::format("chain:      {}\n", FormatChain(*chain));
  out << fmt::format("device:     {} ({}), plan {}, precision {}\n", device->name, device->arch,
                     strategy, precision);
  out << fmt::format("time:       {:.4f} ms median, {:.4f} ms min, of {} runs (L2 flushed)\n",
                     run->median_ms, min_ms, reps);
  out << fmt::format("bandwidth:  {:.1f} GB/s ({:.1f} MB moved); floor {:.4f} ms = {:.0f}%\n",
                     work.bytes / median_s * 1e-9, work.bytes * 1e-6, memory_floor_ms,
                     100 * memory_floor_ms / run->median_ms);
  out << fmt::format("arithmetic: {:.2f} TFLOP/s ({:.2f} GFLOP); fp32 floor {:.4f} ms = {:.0f}%\n",
                     work.flops / median_s * 1e-12, work.flops * 1e-9, flop_floor_ms,
                     100 * flop_floor_ms / run->median_ms);
  for (const KernelTime& k : run->kernels) {
    out << fmt::format("  kernel {:<24} {:.4f} ms ({:.0f}%)\n", k.name, k.median_ms,
                       100 * k.median_ms / run->median_ms);
  }
  return kExitOk;
}

}  // namespace fusejit::tools
