// runtime/bindings.h: checking a run's pointers against a signature (fusejit/signature.h), shared
// by every CompiledChain implementation so their errors read the same.
#ifndef FUSEJIT_RUNTIME_BINDINGS_H_
#define FUSEJIT_RUNTIME_BINDINGS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusejit/fusejit.h"

namespace fusejit::runtime {

// Index of the tensor named `name` in `signature`; -1 when there is none.
int IndexOf(const std::vector<TensorSpec>& signature, std::string_view name);
// "x, 0.weight, y, workspace": the names, for messages.
std::string Names(const std::vector<TensorSpec>& signature);

// Checks pointers in signature order: non-null and aligned. `bound` (optional) tells a missing
// tensor (false) from a null one, for the message.
absl::Status CheckPointers(const std::vector<TensorSpec>& signature, const CUdeviceptr* tensors,
                           const std::vector<bool>* bound);
// One pointer per signature tensor, in its order, from bindings by name: unknown names are an
// error listing the valid ones (except "workspace" where the signature has none: ignored), and
// every tensor must be bound, non-null and aligned.
absl::StatusOr<std::vector<CUdeviceptr>> ResolveBindings(const std::vector<TensorSpec>& signature,
                                                         const NamedBindings& bindings);
// Checks a RunTensors call's count and pointers.
absl::Status CheckTensors(const std::vector<TensorSpec>& signature, const CUdeviceptr* tensors,
                          size_t count);

}  // namespace fusejit::runtime

#endif  // FUSEJIT_RUNTIME_BINDINGS_H_
