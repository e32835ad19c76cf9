// fusejit/signature.h: the tensors a compiled chain reads and writes, described once.
//
// A chain's signature lists every buffer a run binds, by name: the input "x", the output "y",
// each parameter by its nn.Sequential name ("0.weight", "2.bias", ...) and, when the plan needs
// one, the "workspace". Bindings are checked against it (missing, unknown, null and misaligned
// pointers are named in the error), the C ABI and the Python package read it to allocate and
// bind tensors, and `explain` prints it. Room is left for the backward pass's roles.
#ifndef FUSEJIT_SIGNATURE_H_
#define FUSEJIT_SIGNATURE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/chain.h"

namespace fusejit {

enum class TensorRole {
  kInput,      // x: read
  kOutput,     // y: written in full by every run
  kParam,      // a parameter (conv weight/bias, group_norm weight/bias): read
  kWorkspace,  // scratch of workspace_bytes() bytes, contents undefined between runs
  // The backward pass (fusejit::CompileBackward):
  kGradOutput,  // dL/dy: read
  kGradInput,   // dL/dx: written
  kGradParam,   // dL/dparam: written
  kSaved,       // saved by the forward for the backward
};
const char* TensorRoleName(TensorRole role);  // "input", "output", "param", "workspace", ...

struct TensorSpec {
  std::string name;   // "x", "y", "0.weight", "workspace"
  TensorRole role = TensorRole::kInput;
  DType dtype = DType::kF32;  // the workspace is raw bytes; its dtype is meaningless
  Shape shape;        // the workspace: {bytes}
  size_t alignment = 16;  // required byte alignment of the bound pointer
  // Bytes the bound buffer must hold.
  size_t bytes() const;
  bool operator==(const TensorSpec&) const = default;
};

// Names of the fixed tensors.
inline constexpr std::string_view kInputName = "x";
inline constexpr std::string_view kOutputName = "y";
inline constexpr std::string_view kWorkspaceName = "workspace";
// The backward's: the upstream gradient dL/dy, dL/dx, and dL/dparam named "grad_" + the param's
// name ("grad_0.weight").
inline constexpr std::string_view kGradOutputName = "grad_y";
inline constexpr std::string_view kGradInputName = "grad_x";
std::string GradName(std::string_view tensor);

// The forward signature of `chain` run with a plan needing `workspace_bytes`: x, the parameters
// in op order (weight before bias), y, then the workspace when workspace_bytes > 0.
// REQUIRES: chain is valid.
std::vector<TensorSpec> ForwardSignature(const Chain& chain, size_t workspace_bytes);

// The backward signature of `chain` (its gradients from the upstream gradient grad_y):
// x and the parameters (read), grad_y (read, the output's shape), grad_x (written), grad_<param>
// for every parameter in op order (written), then the workspace when workspace_bytes > 0.
// REQUIRES: chain is valid.
std::vector<TensorSpec> BackwardSignature(const Chain& chain, size_t workspace_bytes);

// "x f32[2,3,8,8,8] input", one line per tensor (for explain and error messages).
std::string FormatSignature(const std::vector<TensorSpec>& signature);

}  // namespace fusejit

#endif  // FUSEJIT_SIGNATURE_H_
