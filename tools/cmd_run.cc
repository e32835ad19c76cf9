// fusejit run SPEC: run a chain on the GPU on given or random tensors; optionally check it against
// the CPU reference and write the output.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

struct RunFlags {
  int64_t seed = 0;
  int64_t reps = 10;
  bool check = false;
  bool grad = false;
  CheckOptions check_options;
  CompileOptions compile_options;
};

absl::Status ParseRunFlags(const ParsedArgs& parsed, RunFlags& flags) {
  if (auto v = parsed.Get("seed")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("seed", *v, 0, INT64_MAX);
    if (!n.ok()) return n.status();
    flags.seed = *n;
  }
  if (auto v = parsed.Get("reps")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("reps", *v, 0, 100000);
    if (!n.ok()) return n.status();
    flags.reps = *n;
  }
  if (auto v = parsed.Get("check-samples")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("check-samples", *v, 1, INT64_MAX);
    if (!n.ok()) return n.status();
    flags.check_options.samples = *n;
  }
  if (auto v = parsed.Get("rtol")) {
    absl::StatusOr<double> x = ParseDoubleFlag("rtol", *v);
    if (!x.ok()) return x.status();
    flags.check_options.rtol = *x;
  }
  if (auto v = parsed.Get("atol")) {
    absl::StatusOr<double> x = ParseDoubleFlag("atol", *v);
    if (!x.ok()) return x.status();
    flags.check_options.atol = *x;
  }
  flags.grad = parsed.Has("grad") || parsed.Has("grad-output");
  if (flags.grad && parsed.Has("strategy")) {
    return absl::InvalidArgumentError(
        "--strategy names a forward plan; --grad runs the backward, which plans its own steps");
  }
  flags.check = parsed.Has("check") || parsed.Has("check-samples") || parsed.Has("rtol") ||
                parsed.Has("atol");
  absl::StatusOr<std::string> strategy = StrategyFromFlags(parsed);
  if (!strategy.ok()) return strategy.status();
  flags.compile_options.strategy = *strategy;
  absl::StatusOr<std::string> dump_dir = DumpDirFromFlags(parsed);
  if (!dump_dir.ok()) return dump_dir.status();
  flags.compile_options.dump_dir = *dump_dir;
  return absl::OkStatus();
}

int RunGrad(const Chain& chain, const RunFlags& flags, const HostInputs& inputs,
            std::optional<HostTensor> given_grad_y, std::optional<std::string> output_dir,
            std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = RunSpec();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled =
      CompileBackward(chain, flags.compile_options);
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());
  const HostTensor grad_y = given_grad_y ? *std::move(given_grad_y)
                                         : RandomGradOutput(chain, static_cast<uint64_t>(flags.seed));
  std::map<std::string, HostTensor> reads = inputs.params;
  reads[std::string(kInputName)] = inputs.x;
  reads[std::string(kGradOutputName)] = grad_y;
  absl::StatusOr<SignatureRunResult> run =
      RunSignatureOnDevice(**compiled, reads, {.reps = static_cast<int>(flags.reps)});
  if (!run.ok()) return Failure(err, spec, run.status().message());
  const CompiledChain& c = **compiled;
  out << fmt::format("chain:    {}\n", FormatChain(chain));
  out << fmt::format("arch:     {}, backward ({} kernels)\n", c.arch(), c.kernel_count());
  out << fmt::format("compile:  {:.1f} ms{}\n", compile_ms,
                     c.stats().cache_hit ? " (kernel cache hit)" : "");
  out << fmt::format("workspace: {} bytes\n", c.workspace_bytes());
  if (flags.reps > 0) {
    out << fmt::format("backward: {:.4f} ms (median of {})\n", run->median_ms, flags.reps);
  }
  if (output_dir) {
    std::error_code ec;
    std::filesystem::create_directories(*output_dir, ec);
    for (const auto& [name, t] : run->written) {
      const std::string path = (std::filesystem::path(*output_dir) / (name + ".npy")).string();
      if (absl::Status s = WriteNpy(path, t); !s.ok()) {
        return Failure(err, spec, absl::StrCat("--output: ", s.message()));
      }
      out << fmt::format("wrote:    {}\n", path);
    }
  }
  if (!flags.check) {
    for (const auto& [name, t] : run->written) {
      int64_t non_finite = 0;
      for (float v : t.data) non_finite += std::isfinite(v) ? 0 : 1;
      if (non_finite > 0) out << fmt::format("warning:  {} values of {} are not finite\n", non_finite, name);
    }
    return kExitOk;
  }
  absl::StatusOr<GradientCheckResult> result =
      CheckGradients(chain, inputs, grad_y, run->written, flags.check_options);
  if (!result.ok()) return Failure(err, spec, result.status().message());
  out << fmt::format("check:    {} of {} samples against the float64 reference backward ({:.0f} ms)\n",
                     result->samples.size(), chain.input[0], result->reference_ms);
  out << fmt::format("{:<20} {:>10} {:>10} {:>10} {:>10}\n", "gradient", "rel l2", "max abs",
                     "max rel", "unwritten");
  for (const GradientCheck& g : result->gradients) {
    if (g.checked) {
      out << fmt::format("{:<20} {:>10.3e} {:>10.3e} {:>10.3e} {:>10} {}\n", g.name,
                         g.errors.rel_l2, g.errors.max_abs, g.rel_max, g.unwritten,
                         g.pass ? "ok" : "FAIL");
    } else {
      out << fmt::format("{:<20} {:>10} {:>10} {:>10} {:>10} {}\n", g.name, "-", "-", "-",
                         g.unwritten, "(sum over the batch: check every sample to compare it)");
    }
  }
  out << (result->pass ? "PASS\n" : "FAIL\n");
  return result->pass ? kExitOk : kExitFailure;
}

}  // namespace

const CommandSpec& RunSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit run",
      .positional = "SPEC",
      .min_positional = 1,
      .max_positional = 1,
      .summary = "run a chain on the GPU (device 0), optionally check it against the CPU reference",
      .description =
          "Tensors not given as files are drawn from --seed: x uniform in [0,1) like torch.rand,\n"
          "weights with PyTorch's default init, GroupNorm weight/bias random (not 1/0).\n"
          "Files are .npy, float32 little-endian C order, of exactly the shapes the chain needs;\n"
          "parameters are named as PyTorch's nn.Sequential names them (0.weight, 0.bias, ...).\n"
          "For a bf16 or f16 chain the values are rounded to its dtype (nearest even) before the\n"
          "run and the check, outputs are written as float32 files holding the dtype's values,\n"
          "and the default --rtol/--atol come from the dtype (one rounding: 2^-8 bf16, 2^-11 f16).\n"
          "The output is filled with NaN before the run, so unwritten values show up.\n"
          "Then --reps more runs are timed with CUDA events and their median printed.\n"
          "--check compares with the CPU reference (float64) and fails (exit 1) when the\n"
          "relative L2 error exceeds --rtol, the max abs error exceeds --atol, or any output is\n"
          "not finite. --check-samples, --rtol and --atol imply --check.\n"
          "\n"
          "--grad runs the chain's backward instead (fusejit::CompileBackward): from the upstream\n"
          "gradient grad_y (--grad-output, else uniform in [-1,1) drawn from --seed), the\n"
          "gradients of x and of every parameter, all NaN-poisoned before the run. With --check,\n"
          "each is compared with the float64 reference backward: grad_x on the checked samples,\n"
          "the parameter gradients (sums over the batch) when every sample is checked; it fails\n"
          "when a max abs error exceeds --rtol x the gradient's largest magnitude (the sum of the\n"
          "absolute values of the terms behind a value: meaningful where terms cancel). With --grad, --output is a folder: one NAME.npy per gradient.\n",
      .flags =
          {
              {"input", "FILE.npy", "the input x (default: random)"},
              {"param", "NAME=FILE.npy", "a parameter, e.g. 0.weight=w.npy (default: random)",
               /*repeated=*/true},
              {"output", "FILE.npy", "write the output y here (with --grad: a folder for the gradients)"},
              {"grad", "", "run the backward: the gradients of x and every parameter"},
              {"grad-output", "FILE.npy", "the upstream gradient grad_y (implies --grad)"},
              {"seed", "N", "seed of the random tensors (default 0)"},
              {"check", "", "compare with the CPU reference"},
              {"check-samples", "K",
               "compare K samples spread over the batch, first and last included"},
              {"rtol", "X", "limit on the relative L2 error (default: f32 1e-5; bf16 2^-8 x 1.25; f16 2^-11 x 1.25)"},
              {"atol", "X", "limit on the max abs error (default 1e-4, plus rtol x max |reference| for bf16 and f16)"},
              {"reps", "N", "timed runs after the checked one (default 10; 0: no timing)"},
              StrategyFlag(),
              DumpFlag(),
          },
  };
  return *spec;
}

int RunCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = RunSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  absl::StatusOr<Chain> chain = ParseChain(parsed->positional[0]);
  if (!chain.ok()) return UsageError(err, spec, chain.status().message());

  // Everything the command line can get wrong is checked before any file or device is touched.
  RunFlags flags;
  if (absl::Status s = ParseRunFlags(*parsed, flags); !s.ok()) {
    return InputError(err, spec, s);
  }
  absl::StatusOr<TensorFiles> files = ParseTensorFlags(*parsed, *chain);
  if (!files.ok()) return UsageError(err, spec, files.status().message());
  if (absl::Status s = CheckPlannable(*chain, "", flags.compile_options.strategy); !s.ok()) {
    return UsageError(err, spec, s.message());
  }

  HostInputs given;
  if (absl::Status s = ReadTensorFiles(*files, *chain, given); !s.ok()) {
    return InputError(err, spec, s);  // 2 for a bad file, 1 for an I/O error
  }
  if (auto path = parsed->Get("output")) {
    // Refuse an output nobody can write before spending the run on it.
    const std::filesystem::path parent = std::filesystem::path(*path).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
      return Failure(err, spec, absl::StrCat("--output: ", parent.string(), " is not a directory"));
    }
  }

  std::optional<HostTensor> grad_y;
  if (auto path = parsed->Get("grad-output")) {
    absl::StatusOr<HostTensor> g = ReadNpy(*path);
    if (!g.ok()) return InputError(err, spec, g.status());
    if (g->shape != OutputShape(*chain)) {
      return UsageError(err, spec,
                        absl::StrCat("--grad-output ", *path, " has shape ", FormatShape(g->shape),
                                     "; the chain's output is ", FormatShape(OutputShape(*chain))));
    }
    for (float& v : g->data) v = RoundToDType(v, chain->dtype);  // the values the GPU gets
    grad_y = *std::move(g);
  }

  absl::StatusOr<jit::ScopedPrimaryContext> context = jit::ScopedPrimaryContext::Create(0);
  if (!context.ok()) return Failure(err, spec, context.status().message());
  if (flags.grad) {
    return RunGrad(*chain, flags, InputsWith(*chain, static_cast<uint64_t>(flags.seed), std::move(given)),
                   std::move(grad_y), parsed->Get("output"), out, err);
  }

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(*chain, flags.compile_options);
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());

  HostInputs inputs = InputsWith(*chain, static_cast<uint64_t>(flags.seed), std::move(given));

  absl::StatusOr<DeviceRunResult> run =
      RunOnDevice(**compiled, inputs, {.reps = static_cast<int>(flags.reps)});
  if (!run.ok()) return Failure(err, spec, run.status().message());

  const CompiledChain& c = **compiled;
  const std::string strategy = Inspect(c).strategy;
  out << fmt::format("chain:    {}\n", FormatChain(c.chain()));
  out << fmt::format("arch:     {}, plan {}\n", c.arch(), strategy.empty() ? "?" : strategy);
  out << fmt::format("compile:  {:.1f} ms{}\n", compile_ms,
                     c.stats().cache_hit ? " (kernel cache hit)" : "");
  out << fmt::format("output:   {}\n", FormatShape(c.output_shape()));
  if (flags.reps > 0) {
    out << fmt::format("run:      {:.4f} ms (median of {})\n", run->median_ms, flags.reps);
  }
  if (c.stats().source_path.size()) out << fmt::format("source:   {}\n", c.stats().source_path);

  if (auto path = parsed->Get("output")) {
    if (absl::Status s = WriteNpy(*path, run->output); !s.ok()) {
      return Failure(err, spec, absl::StrCat("--output: ", s.message()));
    }
    out << fmt::format("wrote:    {}\n", *path);
  }

  if (!flags.check) {
    int64_t non_finite = 0;
    for (float v : run->output.data) non_finite += std::isfinite(v) ? 0 : 1;
    if (non_finite > 0)
      out << fmt::format("warning:  {} output values are not finite\n", non_finite);
    return kExitOk;
  }
  absl::StatusOr<CheckResult> result =
      CheckOutput(*chain, inputs, run->output, flags.check_options);
  if (!result.ok()) return Failure(err, spec, result.status().message());
  const int64_t batch = chain->input[0];
  out << fmt::format("check:    {} of {} samples against the float64 CPU reference ({:.0f} ms)\n",
                     result->samples.size(), batch, result->reference_ms);
  out << fmt::format("max abs:  {:.3e} (limit {:.1e})\n", result->errors.max_abs,
                     result->atol);
  out << fmt::format("rel l2:   {:.3e} (limit {:.1e})\n", result->errors.rel_l2, result->rtol);
  out << fmt::format("unwritten (non-finite): {}\n", result->unwritten);
  out << (result->pass ? "PASS\n" : "FAIL\n");
  return result->pass ? kExitOk : kExitFailure;
}

}  // namespace fusejit::tools
