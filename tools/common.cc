#include "tools/common.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/planner.h"
#include "codegen/tap_gemm_plan.h"
#include "jit/driver.h"
#include "jit/dump.h"
#include "jit/nvrtc.h"
#include "runtime/dtype_adapter.h"

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
FlagSpec ConfigFlag() {
  return {"config", "TEXT",
          "use this launch configuration (as `fusejit explain` prints it after \"config:\", e.g. "
          "igemm-store:wg=1,stages=4,async=1,bn=128,split=4) instead of the tuned or default one"};
}
FlagSpec DumpFlag() { return {"dump", "DIR", "write the generated source (and PTX) below DIR"}; }
FlagSpec NoCacheFlag() { return {"no-cache", "", "compile with NVRTC even if the cache has it"}; }
FlagSpec PrecisionFlag() {
  return {"precision", "fp32|tf32", "numeric precision (default fp32; tf32 is opt-in)"};
}

std::string StrategyNames() {
  std::string names;
  for (const auto& s : codegen::AllStrategies()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", std::string(s->name()));
  }
  // A composite of the runtime (runtime/tap_gemm.h), not a planner strategy.
  absl::StrAppend(&names, ", ", std::string(codegen::kTapGemmStrategy));
  return names;
}

absl::Status ValidateArch(const std::string& arch) {
  if (arch.empty()) {
    return absl::InvalidArgumentError(
        "--arch: the architecture is empty; expected sm_XX, e.g. sm_80, sm_90, sm_90a (omit "
        "--arch to use the GPU's, or sm_90 without one)");
  }
  // "sm_" then two or three digits, then at most one of 'a' / 'f' ("sm_90a"), as NVRTC takes them.
  const std::string rest = absl::StartsWith(arch, "sm_") ? arch.substr(3) : "";
  size_t digits = 0;
  while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
  const bool ok = digits >= 2 && digits <= 3 &&
                  (digits == rest.size() ||
                   (digits + 1 == rest.size() && (rest[digits] == 'a' || rest[digits] == 'f')));
  const std::vector<std::string> supported = jit::SupportedArchs();
  const std::string choices =
      supported.empty() ? "" : absl::StrCat("; this NVRTC supports ", absl::StrJoin(supported, ", "));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("--arch: '", absl::CHexEscape(arch),
                                                   "' is not an architecture; expected sm_XX, e.g. "
                                                   "sm_80, sm_90, sm_90a",
                                                   choices));
  }
  const std::string base = absl::StrCat("sm_", rest.substr(0, digits));
  if (!supported.empty() && std::find(supported.begin(), supported.end(), base) == supported.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--arch: ", arch, " is not supported by NVRTC ",
                                                   jit::NvrtcVersion(), choices));
  }
  return absl::OkStatus();
}

absl::Status ValidateStrategy(const std::string& name) {
  if (name == codegen::kTapGemmStrategy) return absl::OkStatus();
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
  info.strategy = compiled.strategy();
  info.cubin_bytes = compiled.cubin_bytes();
  return info;
}

absl::StatusOr<std::string> ArchFromFlags(const ParsedArgs& parsed) {
  if (!parsed.Has("arch")) return std::string();
  const std::vector<std::string> values = parsed.GetAll("arch");
  const std::string arch = values.empty() ? "" : values.back();
  if (absl::Status s = ValidateArch(arch); !s.ok()) return s;  // "" included: refused
  return arch;
}

absl::StatusOr<std::string> StrategyFromFlags(const ParsedArgs& parsed) {
  if (!parsed.Has("strategy")) return std::string();
  const std::vector<std::string> values = parsed.GetAll("strategy");
  const std::string strategy = values.empty() ? "" : values.back();
  if (absl::Status s = ValidateStrategy(strategy); !s.ok()) return s;  // "" included: refused
  return strategy;
}

absl::StatusOr<Precision> PrecisionFromFlags(const ParsedArgs& parsed) {
  const std::string precision = parsed.Get("precision").value_or("fp32");
  if (precision == "fp32") return Precision::kFp32;
  if (precision == "tf32") return Precision::kTf32;
  return absl::InvalidArgumentError(
      absl::StrCat("--precision ", precision, ": expected fp32 or tf32"));
}

absl::StatusOr<CompileOptions> CompileOptionsFromFlags(const ParsedArgs& parsed) {
  CompileOptions options;
  absl::StatusOr<std::string> strategy = StrategyFromFlags(parsed);
  if (!strategy.ok()) return strategy.status();
  options.strategy = *strategy;
  options.tune_config = parsed.Get("config").value_or("");
  absl::StatusOr<Precision> precision = PrecisionFromFlags(parsed);
  if (!precision.ok()) return precision.status();
  options.precision = *precision;
  return options;
}

absl::Status CheckPlannable(const Chain& chain, const std::string& arch,
                            const std::string& strategy) {
  if (absl::Status s = runtime::CheckDTypeCompiles(chain.dtype); !s.ok()) return s;
  if (strategy.empty() || arch.empty()) return absl::OkStatus();
  const Chain& planned = runtime::RunsThroughF32(chain.dtype) ? runtime::AsF32(chain) : chain;
  if (strategy == codegen::kTapGemmStrategy) {  // a runtime composite: its own reason
    std::string why;
    if (!codegen::SplitTapGemm(planned, &why).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("strategy tap-gemm: ", why));
    }
    return absl::OkStatus();
  }
  codegen::PlanTarget target;
  target.arch = arch;
  // A bf16/f16 chain runs its f32 chain's plan (runtime/dtype_adapter.h): the strategy plans that.
  absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(planned, target, strategy);
  if (!plan.ok()) return plan.status();
  return absl::OkStatus();
}

absl::StatusOr<std::string> DumpDirFromFlags(const ParsedArgs& parsed) {
  std::string dir;
  std::string from = "--dump";
  if (parsed.Has("dump")) {
    dir = parsed.GetAll("dump").back();
    if (dir.empty()) return absl::InvalidArgumentError("--dump: the folder name is empty");
  } else if (const char* env = std::getenv("FUSEJIT_DUMP_DIR"); env != nullptr && *env != '\0') {
    dir = env;
    from = "FUSEJIT_DUMP_DIR";
  }
  if (dir.empty()) return dir;
  if (absl::Status s = jit::PrepareDumpDir(dir); !s.ok()) {
    // A folder refused (shared, another user's, a link) is invalid input; an I/O error is not.
    const absl::StatusCode code = s.code() == absl::StatusCode::kFailedPrecondition
                                      ? absl::StatusCode::kInvalidArgument
                                      : s.code();
    return absl::Status(code, absl::StrCat(from, ": ", s.message()));
  }
  return dir;
}

int ExitCodeForInput(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

int InputError(std::ostream& err, const CommandSpec& spec, const absl::Status& status) {
  if (ExitCodeForInput(status) == kExitUsage) return UsageError(err, spec, status.message());
  return Failure(err, spec, status.message());
}

}  // namespace fusejit::tools
