// fusejit compile SPEC: generate and compile only. Works without a GPU.
#include <chrono>

#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
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
          "skipped on a kernel cache hit), the cubin size and the workspace the plan needs.\n",
      .flags = {ArchFlag(), StrategyFlag(), DumpFlag(), NoCacheFlag()},
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

  CompileOptions options;
  const std::string arch = parsed->Get("arch").value_or("");
  if (!arch.empty()) {
    if (absl::Status s = ValidateArch(arch); !s.ok()) return UsageError(err, spec, s.message());
  }
  options.strategy = parsed->Get("strategy").value_or("");
  if (!options.strategy.empty()) {
    if (absl::Status s = ValidateStrategy(options.strategy); !s.ok()) {
      return UsageError(err, spec, s.message());
    }
  }
  options.dump_dir = parsed->Get("dump").value_or("");
  options.use_cache = !parsed->Has("no-cache");

  CompileTarget target = ChooseCompileTarget(arch);
  if (!target.note.empty()) out << target.note << "\n";
  options.arch = target.arch;

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(*chain, options);
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());

  const CompiledChain& c = **compiled;
  const CompileStats& stats = c.stats();
  const CompiledInfo info = Inspect(c);
  out << fmt::format("chain:     {}\n", FormatChain(c.chain()));
  out << fmt::format("arch:      {}\n", c.arch());
  out << fmt::format("strategy:  {}\n", info.strategy.empty() ? "?" : info.strategy);
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
  if (!stats.source_path.empty()) out << fmt::format("source:    {}\n", stats.source_path);
  return kExitOk;
}

}  // namespace fusejit::tools
