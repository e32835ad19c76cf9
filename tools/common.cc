#include "tools/common.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "codegen/planner.h"
#include "jit/compiled_chain.h"
#include "jit/driver.h"

namespace fusejit::tools {

int UsageError(std::ostream& err, const CommandSpec& spec, absl::string_view message) {
  err << spec.name << ": " << message << "\n"
      << "run '" << spec.name << " --help' for usage\n";
  return kExitUsage;
}

int Failure(std::ostream& err, const CommandSpec& spec, absl::string_view message) {
  err << spec.name << ": error: " << message << "\n";
  return kExitFailure;
}

FlagSpec ArchFlag() {
  return {"arch", "sm_XX",
          "target architecture (default: device 0's when a GPU is present, else sm_90)"};
}
FlagSpec StrategyFlag() {
  return {"strategy", "NAME", absl::StrCat("force a plan strategy: ", StrategyNames())};
}
FlagSpec DumpFlag() { return {"dump", "DIR", "write the generated source (and PTX) below DIR"}; }
FlagSpec NoCacheFlag() { return {"no-cache", "", "compile with NVRTC even if the cache has it"}; }

std::string StrategyNames() {
  std::string names;
  for (const auto& s : codegen::AllStrategies()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", std::string(s->name()));
  }
  return names;
}

absl::Status ValidateArch(const std::string& arch) {
  // "sm_" then at least two digits, then at most one lowercase letter ("sm_90a").
  const std::string rest = absl::StartsWith(arch, "sm_") ? arch.substr(3) : "";
  size_t digits = 0;
  while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
  const bool ok = digits >= 2 && (digits == rest.size() ||
                                  (digits + 1 == rest.size() && absl::ascii_islower(rest[digits])));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--arch: '", arch, "' is not an architecture; expected sm_XX, e.g. sm_80, sm_90, sm_90a"));
  }
  return absl::OkStatus();
}

absl::Status ValidateStrategy(const std::string& name) {
  for (const auto& s : codegen::AllStrategies()) {
    if (s->name() == name) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--strategy: unknown strategy '", name, "'; strategies: ", StrategyNames()));
}

CompileTarget ChooseCompileTarget(const std::string& arch_flag) {
  CompileTarget target;
  if (!arch_flag.empty()) {
    target.arch = arch_flag;
    return target;
  }
  constexpr char kFallback[] = "sm_90";
  absl::StatusOr<const jit::DriverApi*> driver = jit::Driver();
  if (!driver.ok()) {
    target.arch = kFallback;
    target.note = absl::StrCat("note: ", driver.status().message(), "\nnote: compiling for ",
                               kFallback, " (give --arch sm_XX to choose)");
    return target;
  }
  absl::StatusOr<jit::ScopedPrimaryContext> context = jit::ScopedPrimaryContext::Create(0);
  if (!context.ok()) {
    target.arch = kFallback;
    target.note =
        absl::StrCat("note: no usable GPU: ", context.status().message(), "\nnote: compiling for ",
                     kFallback, " (give --arch sm_XX to choose)");
    return target;
  }
  target.context.emplace(*std::move(context));
  return target;  // arch empty: Compile asks the current context's device
}

CompiledInfo Inspect(const CompiledChain& compiled) {
  CompiledInfo info;
  if (const auto* impl = dynamic_cast<const jit::CompiledChainImpl*>(&compiled)) {
    info.strategy = impl->plan().strategy;
    info.cubin_bytes = impl->cubin().size();
  }
  return info;
}

absl::StatusOr<std::string> ArchFromFlags(const ParsedArgs& parsed) {
  std::string arch = parsed.Get("arch").value_or("");
  if (!arch.empty()) {
    if (absl::Status s = ValidateArch(arch); !s.ok()) return s;
  }
  return arch;
}

absl::StatusOr<std::string> StrategyFromFlags(const ParsedArgs& parsed) {
  std::string strategy = parsed.Get("strategy").value_or("");
  if (!strategy.empty()) {
    if (absl::Status s = ValidateStrategy(strategy); !s.ok()) return s;
  }
  return strategy;
}

}  // namespace fusejit::tools
