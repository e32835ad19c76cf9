#include "runtime/bindings.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusejit::runtime {

int IndexOf(const std::vector<TensorSpec>& signature, std::string_view name) {
  for (size_t i = 0; i < signature.size(); ++i) {
    if (signature[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Names(const std::vector<TensorSpec>& signature) {
  std::vector<std::string> names;
  for (const TensorSpec& t : signature) names.push_back(t.name);
  return absl::StrJoin(names, ", ");
}

absl::Status CheckPointers(const std::vector<TensorSpec>& signature, const CUdeviceptr* tensors,
                           const std::vector<bool>* bound) {
  for (size_t i = 0; i < signature.size(); ++i) {
    const TensorSpec& t = signature[i];
    if (tensors[i] && tensors[i] % t.alignment == 0) continue;
    const std::string what =
        t.role == TensorRole::kWorkspace
            ? absl::StrCat(t.name, " (", t.bytes(),
                           " bytes; CompiledChain::workspace_bytes(), fusejit::Workspace::Allocate "
                           "allocates it)")
            : absl::StrCat(t.name, " (", TensorRoleName(t.role), ") ", DTypeName(t.dtype),
                           FormatShape(t.shape));
    if (!tensors[i]) {
      const bool missing = bound != nullptr && !(*bound)[i];
      return absl::InvalidArgumentError(
          absl::StrCat("bindings: ", what, missing ? " is missing" : " is null"));
    }
    return absl::InvalidArgumentError(absl::StrCat("bindings: ", what, " must be ", t.alignment,
                                                   "-byte aligned (as cuMemAlloc returns it)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CUdeviceptr>> ResolveBindings(const std::vector<TensorSpec>& signature,
                                                         const NamedBindings& bindings) {
  std::vector<CUdeviceptr> tensors(signature.size(), 0);
  std::vector<bool> bound(signature.size(), false);
  for (const auto& [name, ptr] : bindings) {
    const int i = IndexOf(signature, name);
    if (i < 0 && name == kWorkspaceName) continue;  // a workspace for a plan that needs none
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bindings: unknown tensor '", name,
                                                     "'; this chain binds ", Names(signature)));
    }
    tensors[i] = ptr;
    bound[i] = true;
  }
  if (absl::Status s = CheckPointers(signature, tensors.data(), &bound); !s.ok()) return s;
  return tensors;
}

absl::Status CheckTensors(const std::vector<TensorSpec>& signature, const CUdeviceptr* tensors,
                          size_t count) {
  if (count != signature.size() || (count > 0 && tensors == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("RunTensors: ", count, " pointers for the ",
                                                   signature.size(), " tensors of the signature (",
                                                   Names(signature), ")"));
  }
  return CheckPointers(signature, tensors, nullptr);
}

}  // namespace fusejit::runtime
