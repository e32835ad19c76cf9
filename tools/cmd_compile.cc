// fusejit compile SPEC: generate and compile only. Works without a GPU.
#include <chrono>
#include <optional>

#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "jit/device.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace fusejit::tools {

const CommandSpec& CompileSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit compile",
      .positional = "SPEC",
      .min_positional = 1,
      .max_positional = 1,
      .summary = "generate and compile a chain with NVRTC (no GPU needed); print timings",
      .description =
          "SPEC is the chain's text (quote it), e.g.\n"
          "  'x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | relu'\n"
          "Prints the plan strategy, the time of each stage (plan, codegen, NVRTC; NVRTC is\n"
          "skipped on a kernel cache hit), the cubin size and the workspace the plan needs.\n"
          "--load also loads the module on device 0 (needs a GPU) and times it; --hits N then\n"
          "compiles the same chain N more times in this process and prints the mean time of\n"
          "those in-memory cache hits.\n",
      .flags = {ArchFlag(),
                StrategyFlag(),
                ConfigFlag(),
                PrecisionFlag(),
                DumpFlag(),
                NoCacheFlag(),
                {"grad", "", "the chain's backward (CompileBackward) instead of its forward"},
                {"load", "", "load the module on device 0 and time it (needs a GPU)"},
                {"hits", "N", "then time N in-process cache hits (Compile of the same chain)"}},
  };
  return *spec;
}

int CompileCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = CompileSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  absl::StatusOr<Chain> chain = ParseChain(parsed->positional[0]);
  if (!chain.ok()) return UsageError(err, spec, chain.status().message());

  absl::StatusOr<std::string> arch_flag = ArchFromFlags(*parsed);
  if (!arch_flag.ok()) return UsageError(err, spec, arch_flag.status().message());
  const std::string arch = *arch_flag;
  absl::StatusOr<CompileOptions> flag_options = CompileOptionsFromFlags(*parsed);
  if (!flag_options.ok()) return UsageError(err, spec, flag_options.status().message());
  CompileOptions options = *flag_options;
  if (absl::Status s = CheckPlannable(*chain, arch, options.strategy); !s.ok()) {
    return UsageError(err, spec, s.message());
  }
  absl::StatusOr<std::string> dump_dir = DumpDirFromFlags(*parsed);
  if (!dump_dir.ok()) return InputError(err, spec, dump_dir.status());
  options.dump_dir = *dump_dir;
  options.use_cache = !parsed->Has("no-cache");

  int64_t hits = 0;
  if (auto v = parsed->Get("hits")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("hits", *v, 1, 100000000);
    if (!n.ok()) return UsageError(err, spec, n.status().message());
    hits = *n;
  }
  const bool load = parsed->Has("load");
  std::optional<jit::ScopedPrimaryContext> context;
  double context_ms = 0;
  if (load) {
    const auto c0 = std::chrono::steady_clock::now();
    absl::StatusOr<jit::ScopedPrimaryContext> ctx = jit::ScopedPrimaryContext::Create(0);
    if (!ctx.ok()) return Failure(err, spec, ctx.status().message());
    context.emplace(*std::move(ctx));
    context_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0)
                     .count();
    options.arch = arch;  // empty: the device's
  } else {
    CompileTarget target = ChooseCompileTarget(arch);
    if (!target.note.empty()) out << target.note << "\n";
    options.arch = target.arch;
  }

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = (parsed->Has("grad") ? CompileBackward : Compile)(*chain, options);
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());
  double load_ms = 0;
  if (load) {
    const auto l0 = std::chrono::steady_clock::now();
    if (absl::Status s = (*compiled)->Load(); !s.ok()) return Failure(err, spec, s.message());
    load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - l0)
                  .count();
  }
  double hit_us = 0;
  if (hits > 0) {
    const auto h0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < hits; ++i) {
      absl::StatusOr<std::shared_ptr<CompiledChain>> again = (parsed->Has("grad") ? CompileBackward : Compile)(*chain, options);
      if (!again.ok()) return Failure(err, spec, again.status().message());
    }
    hit_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0)
                 .count() / static_cast<double>(hits);
  }

  const CompiledChain& c = **compiled;
  const CompileStats& stats = c.stats();
  const CompiledInfo info = Inspect(c);
  out << fmt::format("chain:     {}\n", FormatChain(c.chain()));
  out << fmt::format("arch:      {}\n", c.arch());
  out << fmt::format("strategy:  {}\n", info.strategy.empty() ? "?" : info.strategy);
  out << fmt::format("tuning:    {}\n", stats.tune_origin);  // default, tuned or given
  out << fmt::format("output:    {}\n", FormatShape(c.output_shape()));
  out << fmt::format("workspace: {} bytes\n", c.workspace_bytes());
  out << fmt::format("plan:      {:.2f} ms\n", stats.plan_ms);
  out << fmt::format("codegen:   {:.2f} ms\n", stats.codegen_ms);
  if (stats.cache_hit) {
    out << "NVRTC:     skipped (kernel cache hit)\n";
  } else {
    out << fmt::format("NVRTC:     {:.1f} ms\n", stats.nvrtc_ms);
  }
  out << fmt::format("cache:     {}\n",
                     !options.use_cache ? "off" : (stats.cache_hit ? "hit" : "miss"));
  out << fmt::format("cubin:     {} bytes\n", info.cubin_bytes);
  out << fmt::format("total:     {:.1f} ms\n", total_ms);
  if (load) {
    out << fmt::format("load:      {:.2f} ms (module load; context creation {:.1f} ms)\n", load_ms,
                       context_ms);
    out << fmt::format("compile+load: {:.2f} ms\n", total_ms + load_ms);
  }
  if (hits > 0) out << fmt::format("memory hit: {:.3f} us (mean of {})\n", hit_us, hits);
  if (!stats.source_path.empty()) out << fmt::format("source:    {}\n", stats.source_path);
  return kExitOk;
}

}  // namespace fusejit::tools
