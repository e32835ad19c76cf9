// tools/common.h: what the CLI's commands share besides running (tools/runner.h): exit codes,
// error printing, the compile target, compile options from flags and a look inside a compiled
// chain.
#ifndef FUSEJIT_TOOLS_COMMON_H_
#define FUSEJIT_TOOLS_COMMON_H_

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fusejit/fusejit.h"
#include "jit/device.h"
#include "tools/args.h"

namespace fusejit::tools {

// Process exit statuses of every command, one per class of error:
inline constexpr int kExitOk = 0;
// A failure while doing valid work: NVRTC, the driver or the GPU failed, a check failed, an I/O
// error, no usable kernel cache.
inline constexpr int kExitFailure = 1;
// Usage or invalid input: flags, spec, architecture, strategy, and the files and environment the
// command reads (a manifest or .npy file that is missing, malformed, too large or not a regular
// file; invalid specs in a manifest).
inline constexpr int kExitUsage = 2;

// The signature of every command: args are the words after the command's name.
using CommandFn = int (*)(const std::vector<std::string>& args, std::ostream& out,
                          std::ostream& err);

// Prints "<command>: <message>" and a pointer to --help to `err`; returns kExitUsage.
int UsageError(std::ostream& err, const CommandSpec& spec, absl::string_view message);
// Prints "<command>: error: <message>" to `err`; returns kExitFailure.
int Failure(std::ostream& err, const CommandSpec& spec, absl::string_view message);

// The flags shared by the commands that compile (add the ones a command needs to its spec).
FlagSpec ArchFlag();
FlagSpec StrategyFlag();
// --config TEXT: a launch configuration as `fusejit explain` prints it
// (CompileOptions::tune_config).
FlagSpec ConfigFlag();
FlagSpec DumpFlag();
FlagSpec NoCacheFlag();
FlagSpec PrecisionFlag();  // --precision fp32|tf32

// Names of the plan strategies, comma-separated, for help texts and errors.
std::string StrategyNames();

// OK if `arch` looks like an NVRTC real architecture ("sm_80", "sm_90a"); otherwise an error
// naming it and the expected form.
absl::Status ValidateArch(const std::string& arch);
// OK if `name` is a known strategy; otherwise an error listing them.
absl::Status ValidateStrategy(const std::string& name);

// The value of --arch / --strategy, validated as above; "" when the flag is absent (an empty value
// is refused).
absl::StatusOr<std::string> ArchFromFlags(const ParsedArgs& parsed);
absl::StatusOr<std::string> StrategyFromFlags(const ParsedArgs& parsed);
// The value of --precision: kFp32 when absent (TF32 is opt-in); an error naming the value and the
// choices otherwise.
absl::StatusOr<Precision> PrecisionFromFlags(const ParsedArgs& parsed);
// The options --strategy, --config and --precision give (the three above; a flag the command's
// spec lacks counts as absent). Errors are usage errors, naming the flag.
absl::StatusOr<CompileOptions> CompileOptionsFromFlags(const ParsedArgs& parsed);

// OK when the chain can be planned: its dtype has plans and, when both are given, `strategy`
// applies to it on `arch`. Errors are input errors (exit 2), so a command refuses what it cannot
// plan before compiling anything.
absl::Status CheckPlannable(const Chain& chain, const std::string& arch,
                            const std::string& strategy);

// The dump folder asked for by --dump DIR, else FUSEJIT_DUMP_DIR; "" when neither. The folder is
// checked (and created) with jit::PrepareDumpDir: a folder refused (a symbolic link, another
// user's, writable by others) is InvalidArgument, as is an empty --dump.
absl::StatusOr<std::string> DumpDirFromFlags(const ParsedArgs& parsed);

// The exit status for an error in reading or checking input (a file, a value): kExitUsage for
// InvalidArgument, NotFound, PermissionDenied, OutOfRange, Unimplemented; kExitFailure otherwise
// (an I/O error). InputError prints it like UsageError or Failure and returns it.
int ExitCodeForInput(const absl::Status& status);
int InputError(std::ostream& err, const CommandSpec& spec, const absl::Status& status);

// Where to compile. With --arch: that architecture, no context. Without: device 0 when a driver
// and a device exist (its primary context is held, so Compile sees the real device, SM count
// included), else sm_90, with a note saying why.
struct CompileTarget {
  std::optional<jit::ScopedPrimaryContext> context;
  std::string arch;  // for CompileOptions::arch; empty: the current context's device
  std::string note;  // one line for the user when the choice was a fallback; else empty
};
CompileTarget ChooseCompileTarget(const std::string& arch_flag);

// What the public CompiledChain does not expose: the plan strategy and the cubin. Empty / 0 if
// the instance is not the library's own implementation.
struct CompiledInfo {
  std::string strategy;
  size_t cubin_bytes = 0;
};
CompiledInfo Inspect(const CompiledChain& compiled);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_COMMON_H_
