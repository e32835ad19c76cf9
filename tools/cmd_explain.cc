// fusejit explain SPEC: the plan (kernels, launch dimensions, workspace) and the generated source,
// which explain always writes to disk so it can be read: below --dump DIR (a folder of the user's
// own), else in a new private folder (jit/dump.h).
#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "jit/dump.h"
#include "runtime/stages.h"
#include "runtime/training.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace fusejit::tools {

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
          "PTX) is always written: below --dump DIR (created 0700 when missing; it must be your\n"
          "own folder, not a symbolic link, not writable by others), else in a new private\n"
          "folder $TMPDIR/fusejit-explain.XXXXXX (the newest {} such folders are kept).\n",
          jit::kKeepDumps),
      .flags = {ArchFlag(),
                StrategyFlag(),
                ConfigFlag(),
                {"grad", "", "explain the chain's backward: its steps, tensors and workspace"},
                {"training", "",
                 "explain the chain's training forward: whether it saves the convolution's "
                 "output for the backward, and why"},
                PrecisionFlag(),
                DumpFlag()},
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
  options.dump_dir = *dump_dir;  // "": a new private folder, made below

  CompileTarget target = ChooseCompileTarget(arch);
  if (!target.note.empty()) out << target.note << "\n";
  options.arch = target.arch;
  if (options.dump_dir.empty()) {
    absl::StatusOr<std::string> dir = jit::NewPrivateDumpDir("explain");
    if (!dir.ok()) return Failure(err, spec, dir.status().message());
    options.dump_dir = *dir;
  }

  if (parsed->Has("grad") && parsed->Has("training")) {
    return UsageError(err, spec, "--grad and --training explain different passes: give one");
  }
  if (parsed->Has("training") && !options.strategy.empty()) {
    return UsageError(err, spec, "--strategy names one forward plan; leave it out with --training");
  }
  auto compile = parsed->Has("grad")       ? CompileBackward
                 : parsed->Has("training") ? CompileTrainingForward
                                           : Compile;
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = compile(*chain, options);
  if (!compiled.ok()) return Failure(err, spec, compiled.status().message());
  if (parsed->Has("training") && !TrainingForwardSaves(*chain, options)) {
    absl::StatusOr<runtime::Target> t = runtime::ResolveTarget(options);
    out << "training forward: saves nothing ("
        << (t.ok() ? runtime::DecideSave(*chain, t->plan_target).why : t.status().ToString())
        << "); the forward below, and the backward recomputes\n";
  }
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
