// fusejit: the command-line tool. Dispatches to the commands of tools/commands.h and
// tools/cmd_cache.h; see `fusejit --help`.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fusejit/fusejit.h"
#include "tools/commands.h"
#include "tools/common.h"

// `fusejit cache` is implemented by the cache library's engineer (fusejit_cache_cli);
// tools/CMakeLists.txt defines FUSEJIT_HAVE_CACHE_CLI when that target exists.
#if FUSEJIT_HAVE_CACHE_CLI
#include "tools/cmd_cache.h"
#endif

namespace fusejit::tools {
namespace {

#if !FUSEJIT_HAVE_CACHE_CLI
int RunCacheCommand(const std::vector<std::string>&, std::ostream&, std::ostream& err) {
  err << "fusejit cache: not available in this build (fusejit_cache_cli was not built)\n";
  return kExitFailure;
}
#endif

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"run", RunSpec().summary.c_str(), RunCommand},
      {"compile", CompileSpec().summary.c_str(), CompileCommand},
      {"explain", ExplainSpec().summary.c_str(), ExplainCommand},
      {"bench", BenchSpec().summary.c_str(), BenchCommand},
      {"seeds", SeedsSpec().summary.c_str(), SeedsCommand},
      {"autotune", AutotuneSpec().summary.c_str(), AutotuneCommand},
      {"prewarm", PrewarmSpec().summary.c_str(), PrewarmCommand},
      {"cache", "inspect the kernel cache: stats, list, verify, clear", RunCacheCommand},
  };
  return *commands;
}

std::string TopLevelHelp() {
  std::string s =
      "usage: fusejit <command> [args] [flags]\n"
      "\n"
      "fusejit compiles fused op chains (conv3d / conv_transpose3d, elementwise ops, group_norm,\n"
      "mean) into shape-specialized CUDA kernels with NVRTC and runs them through the driver API.\n"
      "A chain is written as a spec, e.g.\n"
      "  'x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | swish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])'\n"
      "\n"
      "commands:\n";
  for (const Command& c : Commands()) s += fmt::format("  {:<8} {}\n", c.name, c.summary);
  s += "\n"
       "Run 'fusejit <command> --help' for a command's flags; 'fusejit --version' prints the\n"
       "build (the version and a digest of its templates and planner: tuning records and timing\n"
       "decisions of another build are not used). Exit status: 0 success, 1 failure\n"
       "(including a failed check), 2 usage error.\n"
       "Environment: FUSEJIT_CACHE_DIR (kernel cache folder), FUSEJIT_DISABLE_CACHE=1,\n"
       "FUSEJIT_DUMP_DIR (write every generated source there), FUSEJIT_DISABLE_TUNING=1 (ignore\n"
       "the configurations `fusejit autotune` stored), FUSEJIT_DISABLE_PDL=1 (launch each kernel\n"
       "only after the previous one has finished, instead of programmatic dependent launch on\n"
       "sm_90 and later).\n";
  return s;
}

int Main(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << TopLevelHelp();
    return kExitUsage;
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    if (args.size() > 1) return Main({args[1], "--help"});  // fusejit help run
    std::cout << TopLevelHelp();
    return kExitOk;
  }
  if (name == "--version") {
    std::cout << GeneratorBuild() << "\n";
    return kExitOk;
  }
  for (const Command& c : Commands()) {
    if (name == c.name) {
      return c.run(std::vector<std::string>(args.begin() + 1, args.end()), std::cout, std::cerr);
    }
  }
  std::string names;
  for (const Command& c : Commands()) names += names.empty() ? c.name : fmt::format(", {}", c.name);
  std::cerr << fmt::format("fusejit: unknown command '{}'; commands: {}\n", name, names)
            << "run 'fusejit --help' for usage\n";
  return kExitUsage;
}

}  // namespace
}  // namespace fusejit::tools

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(true);
  try {
    const int status = fusejit::tools::Main(std::vector<std::string>(argv + 1, argv + argc));
    std::cout.flush();
    return status;
  } catch (const std::exception& e) {
    // The library reports errors as absl::Status; this only catches what the standard library
    // throws (e.g. std::bad_alloc for an output too large for host memory).
    std::cout.flush();
    std::cerr << "fusejit: error: " << e.what() << "\n";
    return fusejit::tools::kExitFailure;
  }
}
