#include "fusejit/signature.h"

#include "absl/strings/str_cat.h"

namespace fusejit {

const char* TensorRoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kInput: return "input";
    case TensorRole::kOutput: return "output";
    case TensorRole::kParam: return "param";
    case TensorRole::kWorkspace: return "workspace";
    case TensorRole::kGradOutput: return "grad_output";
    case TensorRole::kGradInput: return "grad_input";
    case TensorRole::kGradParam: return "grad_param";
    case TensorRole::kSaved: return "saved";
  }
  return "?";
}

size_t TensorSpec::bytes() const {
  if (role == TensorRole::kWorkspace) return shape.empty() ? 0 : static_cast<size_t>(shape[0]);
  return static_cast<size_t>(NumElements(shape)) * DTypeBytes(dtype);
}

std::vector<TensorSpec> ForwardSignature(const Chain& chain, size_t workspace_bytes) {
  std::vector<TensorSpec> sig;
  sig.push_back({std::string(kInputName), TensorRole::kInput, chain.dtype, chain.input, 16});
  for (ParamSpec& p : ChainParams(chain)) {
    sig.push_back({std::move(p.name), TensorRole::kParam, chain.dtype, std::move(p.shape), 16});
  }
  sig.push_back({std::string(kOutputName), TensorRole::kOutput, chain.dtype, OutputShape(chain), 16});
  if (workspace_bytes > 0) {
    sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                   {static_cast<int64_t>(workspace_bytes)}, 256});
  }
  return sig;
}

std::string GradName(std::string_view tensor) { return "grad_" + std::string(tensor); }

std::vector<TensorSpec> BackwardSignature(const Chain& chain, size_t workspace_bytes) {
  std::vector<TensorSpec> sig;
  sig.push_back({std::string(kInputName), TensorRole::kInput, chain.dtype, chain.input, 16});
  const std::vector<ParamSpec> params = ChainParams(chain);
  for (const ParamSpec& p : params) {
    sig.push_back({p.name, TensorRole::kParam, chain.dtype, p.shape, 16});
  }
  sig.push_back({std::string(kGradOutputName), TensorRole::kGradOutput, chain.dtype,
                 OutputShape(chain), 16});
  sig.push_back({std::string(kGradInputName), TensorRole::kGradInput, chain.dtype, chain.input, 16});
  for (const ParamSpec& p : params) {
    sig.push_back({GradName(p.name), TensorRole::kGradParam, chain.dtype, p.shape, 16});
  }
  if (workspace_bytes > 0) {
    sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                   {static_cast<int64_t>(workspace_bytes)}, 256});
  }
  return sig;
}

std::string FormatSignature(const std::vector<TensorSpec>& signature) {
  std::string s;
  for (const TensorSpec& t : signature) {
    if (t.role == TensorRole::kWorkspace) {
      absl::StrAppend(&s, t.name, " ", t.bytes(), " bytes (", t.alignment, "-byte aligned)\n");
    } else {
      absl::StrAppend(&s, t.name, " ", DTypeName(t.dtype), FormatShape(t.shape), " ",
                      TensorRoleName(t.role), "\n");
    }
  }
  return s;
}

}  // namespace fusejit
