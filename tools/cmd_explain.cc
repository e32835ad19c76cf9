// fusejit explain SPEC: the plan (kernels, launch dimensions, workspace) and the generated source,
// which explain always writes to disk so it can be read.
#include <filesystem>
#include <system_error>

#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace fusejit::tools {
namespace {

std::string DefaultDumpDir() {
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  return (tmp / "fusejit-explain").string();
}

}  // namespace

const CommandSpec& ExplainSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit explain",
      .positional = "SPEC",
      .min_positional = 1,
      .max_positional = 1,
      .summary = "print a chain's plan (kernels, launch dimensions, workspace) and its source",
      .description = fmt::format(
          "Compiles SPEC (no GPU needed) and prints the plan the planner chose, every kernel\n"
          "with its launch dimensions and the workspace layout. The generated source (and its\n"
          "PTX) is always written: below --dump DIR, default {}.\n",
          DefaultDumpDir()),
      .flags = {ArchFlag(), StrategyFlag(), DumpFlag()},
  };
  return *spec;
}

int ExplainCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = ExplainSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  absl::StatusOr<Chain> chain = ParseChain(parsed->positional[0]);
  if (!chain.ok()) return UsageError(err, spec, chain.status().message());

  CompileOptions options;
  absl::StatusOr<std::string> arch_flag = ArchFromFlags(*parsed);
  if (!arch_flag.ok()) return UsageError(err, spec, arch_flag.status().message());
  const std::string arch = *arch_flag;
  absl::StatusOr<std::string> strategy = StrategyFromFlags(*parsed);
  if (!strategy.ok()) return UsageError(err, spec, strategy.status().message());
  options.strategy = *strategy;
  options.dump_dir = parsed->Get("dump").value_or(DefaultDumpDir());

  CompileTarget target = ChooseCompileTarget(arch);
  if (!target.note.empty()) out << target.note << "\n";
  options.arch = target.arch;

  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(*chain, options);
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());
  const CompiledChain& c = **compiled;
  const std::string explained = c.Explain();
  out << explained;
  const std::string& path = c.stats().source_path;
  if (path.empty()) {
    return Failure(err, spec, "the generated source was not written (no source path returned)");
  }
  if (explained.find(path) == std::string::npos) {
    out << fmt::format("generated source: {}\n", path);
  }
  return kExitOk;
}

}  // namespace fusejit::tools
