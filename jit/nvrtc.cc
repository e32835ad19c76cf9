// jit/nvrtc.cc: NVRTC programs, RAII, with the log fetched before the result is judged.
#include "jit/nvrtc.h"

#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusejit::jit {
namespace {

constexpr char kDefaultProgramName[] = "fusejit_program.cu";

// Debian's Abseil keeps absl::string_view distinct from std::string_view.
absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status NvrtcError(nvrtcResult r, std::string_view what) {
  return absl::InternalError(absl::StrCat(AbslView(what), ": ", nvrtcGetErrorString(r)));
}

#define FUSEJIT_NVRTC_RETURN_IF_ERROR(call, what)       \
  do {                                                  \
    const nvrtcResult fusejit_nvrtc_result_ = (call);   \
    if (fusejit_nvrtc_result_ != NVRTC_SUCCESS) {       \
      return NvrtcError(fusejit_nvrtc_result_, (what)); \
    }                                                   \
  } while (false)

// Owns an nvrtcProgram; destroys it on every path.
class Program {
 public:
  Program() = default;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  ~Program() {
    // Nothing to report to from a destructor; a failure here can only leak the program.
    if (program_ != nullptr) (void)nvrtcDestroyProgram(&program_);
  }
  nvrtcProgram* out() { return &program_; }
  nvrtcProgram get() const { return program_; }

 private:
  nvrtcProgram program_ = nullptr;
};

struct Arch {
  int number = 0;      // 90 for sm_90a
  std::string suffix;  // "", "a" or "f"
};

absl::StatusOr<Arch> ParseArch(std::string_view arch) {
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "arch '", AbslView(arch), "' is not valid: expected sm_XX such as sm_80 or sm_90"));
  };
  if (arch.substr(0, 3) != "sm_") return invalid();
  std::string_view rest = arch.substr(3);
  Arch parsed;
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) {
    parsed.suffix = std::string(1, rest.back());
    rest.remove_suffix(1);
  }
  if (rest.size() < 2 || rest.size() > 3) return invalid();
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return absl::ascii_isdigit(c); })) {
    return invalid();
  }
  if (!absl::SimpleAtoi(AbslView(rest), &parsed.number) || parsed.number < 50) return invalid();
  return parsed;
}

const std::vector<int>& SupportedArchNumbers() {
  static const std::vector<int> archs = [] {
    std::vector<int> out;
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return out;
    out.resize(n);
    if (nvrtcGetSupportedArchs(out.data()) != NVRTC_SUCCESS) out.clear();
    std::sort(out.begin(), out.end());
    return out;
  }();
  return archs;
}

struct CompileOutput {
  std::string binary;  // cubin or PTX
  std::string log;
};

// One NVRTC program compiled with --gpu-architecture=<gpu_arch>; returns the cubin for a real
// arch (sm_XX) or the PTX for a virtual one (compute_XX).
absl::StatusOr<CompileOutput> CompileOnce(const NvrtcRequest& request, const std::string& gpu_arch,
                                          bool cubin) {
  const std::string name = request.name.empty() ? kDefaultProgramName : request.name;
  std::vector<const char*> header_texts;
  std::vector<const char*> header_names;
  for (const auto& [include_name, text] : request.headers) {
    header_names.push_back(include_name.c_str());
    header_texts.push_back(text.c_str());
  }
  Program program;
  FUSEJIT_NVRTC_RETURN_IF_ERROR(
      nvrtcCreateProgram(program.out(), request.source.c_str(), name.c_str(),
                         static_cast<int>(header_texts.size()), header_texts.data(),
                         header_names.data()),
      absl::StrCat("nvrtcCreateProgram('", name, "')"));

  std::vector<std::string> options = {"--gpu-architecture=" + gpu_arch, "-std=c++17"};
  options.insert(options.end(), request.options.begin(), request.options.end());
  std::vector<const char*> option_ptrs;
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());

  const nvrtcResult compiled =
      nvrtcCompileProgram(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());

  // The log first: it is what explains a failed compile.
  CompileOutput out;
  size_t log_size = 0;
  FUSEJIT_NVRTC_RETURN_IF_ERROR(nvrtcGetProgramLogSize(program.get(), &log_size),
                                "nvrtcGetProgramLogSize");
  if (log_size > 1) {
    out.log.resize(log_size);
    FUSEJIT_NVRTC_RETURN_IF_ERROR(nvrtcGetProgramLog(program.get(), out.log.data()),
                                  "nvrtcGetProgramLog");
    out.log.resize(log_size - 1);  // drop the terminating NUL
  }

  if (compiled != NVRTC_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVRTC failed to compile '", name, "' for ", gpu_arch, " (", nvrtcGetErrorString(compiled),
        ", options: ", absl::StrJoin(options, " "), "):\n", out.log));
  }

  size_t size = 0;
  if (cubin) {
    FUSEJIT_NVRTC_RETURN_IF_ERROR(nvrtcGetCUBINSize(program.get(), &size), "nvrtcGetCUBINSize");
    out.binary.resize(size);
    FUSEJIT_NVRTC_RETURN_IF_ERROR(nvrtcGetCUBIN(program.get(), out.binary.data()), "nvrtcGetCUBIN");
  } else {
    FUSEJIT_NVRTC_RETURN_IF_ERROR(nvrtcGetPTXSize(program.get(), &size), "nvrtcGetPTXSize");
    out.binary.resize(size);
    FUSEJIT_NVRTC_RETURN_IF_ERROR(nvrtcGetPTX(program.get(), out.binary.data()), "nvrtcGetPTX");
    // PTX size includes the terminating NUL.
    while (!out.binary.empty() && out.binary.back() == '\0') out.binary.pop_back();
  }
  if (out.binary.empty()) {
    return absl::InternalError(absl::StrCat("NVRTC produced an empty ", cubin ? "cubin" : "PTX",
                                            " for '", name, "' (", gpu_arch, ")"));
  }
  return out;
}

}  // namespace

absl::StatusOr<NvrtcResult> CompileCuda(const NvrtcRequest& request) {
  absl::StatusOr<Arch> arch = ParseArch(request.arch);
  if (!arch.ok()) return arch.status();
  const std::vector<int>& supported = SupportedArchNumbers();
  if (!supported.empty() && !std::binary_search(supported.begin(), supported.end(), arch->number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arch '", request.arch, "' is not supported by NVRTC ", NvrtcVersion(),
                     ": expected one of ", absl::StrJoin(SupportedArchs(), ", ")));
  }

  const auto start = std::chrono::steady_clock::now();
  NvrtcResult result;
  absl::StatusOr<CompileOutput> cubin = CompileOnce(request, request.arch, /*cubin=*/true);
  if (!cubin.ok()) return cubin.status();
  result.cubin = std::move(cubin->binary);
  result.log = std::move(cubin->log);
  if (request.want_ptx) {
    const std::string virtual_arch = absl::StrCat("compute_", arch->number, arch->suffix);
    absl::StatusOr<CompileOutput> ptx = CompileOnce(request, virtual_arch, /*cubin=*/false);
    if (!ptx.ok()) return ptx.status();
    result.ptx = std::move(ptx->binary);
  }
  result.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string NvrtcVersion() {
  int major = 0;
  int minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return absl::StrCat(major, ".", minor);
}

absl::StatusOr<int> ArchNumber(std::string_view arch) {
  absl::StatusOr<Arch> parsed = ParseArch(arch);
  if (!parsed.ok()) return parsed.status();
  return parsed->number;
}

std::vector<std::string> SupportedArchs() {
  std::vector<std::string> out;
  for (int a : SupportedArchNumbers()) out.push_back(absl::StrCat("sm_", a));
  return out;
}

}  // namespace fusejit::jit
