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

// Process exit statuses of every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command could not do its job (or a check failed)
inline constexpr int kExitUsage = 2;    // the command line is wrong (flags, spec, names)

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
FlagSpec DumpFlag();
FlagSpec NoCacheFlag();

// Names of the plan strategies, comma-separated, for help texts and errors.
std::string StrategyNames();

// OK if `arch` looks like an NVRTC real architecture ("sm_80", "sm_90a"); otherwise an error
// naming it and the expected form.
absl::Status ValidateArch(const std::string& arch);
// OK if `name` is a known strategy; otherwise an error listing them.
absl::Status ValidateStrategy(const std::string& name);

// The value of --arch / --strategy, validated as above; "" when the flag is absent.
absl::StatusOr<std::string> ArchFromFlags(const ParsedArgs& parsed);
absl::StatusOr<std::string> StrategyFromFlags(const ParsedArgs& parsed);

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
