// jit/nvrtc.h: CUDA C++ source -> cubin (and optionally PTX) with NVRTC.
//
// NVRTC is linked normally; it needs no GPU and no driver, so everything here works on any machine
// with the CUDA toolkit's libnvrtc.
//
//   jit::NvrtcRequest req{.name = "saxpy.cu", .source = src, .arch = "sm_90"};
//   absl::StatusOr<jit::NvrtcResult> out = jit::CompileCuda(req);
//   if (!out.ok()) return out.status();     // InvalidArgument carrying the NVRTC log
//   ... jit::LoadedModule::Load(out->cubin) ...
//
// Kernels meant to be found by name (LoadedModule::Function) should be declared
// `extern "C" __global__`, so their symbol is their plain name.
#ifndef FUSEJIT_JIT_NVRTC_H_
#define FUSEJIT_JIT_NVRTC_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit::jit {

struct NvrtcRequest {
  // Program name, shown in the NVRTC log ("saxpy.cu"); empty: "fusejit_program.cu".
  std::string name;
  // The translation unit.
  std::string source;
  // In-memory headers: #include name -> text. Resolved before any include path.
  std::vector<std::pair<std::string, std::string>> headers;
  // Real architecture, "sm_" + 2-3 digits >= 50, optionally followed by 'a' or 'f' (sm_90a); it
  // must also be one NVRTC supports (SupportedArchs()).
  std::string arch;
  // Extra NVRTC options, appended after fusejit's own (--gpu-architecture=<arch>, -std=c++17), e.g.
  // "-DBLOCK=256", "--use_fast_math", "-lineinfo".
  std::vector<std::string> options;
  // Also produce PTX. NVRTC cannot emit PTX from a program compiled for a real architecture, so
  // this compiles the source a second time for the matching virtual one (compute_XX), roughly
  // doubling the compile time. For dumps and debugging only.
  bool want_ptx = false;
};

struct NvrtcResult {
  std::string cubin;      // ELF image for `arch`, loadable with cuModuleLoadData
  std::string ptx;        // only when want_ptx; NUL-free text
  std::string log;        // the NVRTC log of the cubin compile (warnings), possibly empty
  double compile_ms = 0;  // wall time of all NVRTC work in this call (both compiles if want_ptx)
};

// Compiles request.source for request.arch.
// Errors:
//   InvalidArgument "arch 'foo' is not valid: expected sm_XX such as sm_80 or sm_90" for a
//     malformed arch, or naming the supported archs when NVRTC does not support it;
//   InvalidArgument "NVRTC failed to compile '<name>' for <arch> (...):\n<log>" when the source
//   does
//     not compile (the log names the offending line and identifier);
//   Internal for any other NVRTC failure, naming the call.
// Thread-safe: concurrent calls compile distinct NVRTC programs, which NVRTC allows.
absl::StatusOr<NvrtcResult> CompileCuda(const NvrtcRequest& request);

// The NVRTC version, "13.0"; "unknown" if NVRTC cannot say. Thread-safe.
std::string NvrtcVersion();

// The real architectures this NVRTC can compile for, ascending: {"sm_75", "sm_80", ...}. Empty if
// NVRTC cannot say. Thread-safe.
std::vector<std::string> SupportedArchs();

// The number of an architecture name: 90 for "sm_90" and "sm_90a", 100 for "sm_100f". Error
// InvalidArgument, as CompileCuda words it, for a malformed name. Thread-safe.
absl::StatusOr<int> ArchNumber(std::string_view arch);

}  // namespace fusejit::jit

#endif  // FUSEJIT_JIT_NVRTC_H_
