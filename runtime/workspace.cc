// runtime/workspace.cc: fusejit::Workspace (include/fusejit/fusejit.h) over the run-time-loaded driver.
#include <utility>

#include "absl/strings/str_cat.h"
#include "fusejit/fusejit.h"
#include "jit/driver.h"

namespace fusejit {

absl::StatusOr<Workspace> Workspace::Allocate(size_t bytes) {
  if (bytes == 0) return Workspace(0, 0);  // nothing to allocate; no driver needed
  absl::StatusOr<const jit::DriverApi*> api = jit::Driver();
  if (!api.ok()) return api.status();
  if (absl::Status s = jit::RequireCurrentContext("Workspace::Allocate"); !s.ok()) return s;
  CUdeviceptr ptr = 0;
  // cuMemAlloc's pointers are at least 256-byte aligned, as Bindings::workspace requires.
  FUSEJIT_CU_RETURN_IF_ERROR((*api)->cuMemAlloc(&ptr, bytes),
                             absl::StrCat("Workspace::Allocate: cuMemAlloc(", bytes, " bytes)"));
  return Workspace(ptr, bytes);
}

Workspace::Workspace(Workspace&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

Workspace& Workspace::operator=(Workspace&& other) noexcept {
  if (this != &other) {
    Workspace old(std::move(*this));  // frees the previous allocation at the end of this scope
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Workspace::~Workspace() {
  if (ptr_ == 0) return;
  absl::StatusOr<const jit::DriverApi*> api = jit::Driver();  // OK: ptr_ came from cuMemAlloc
  // A destructor cannot report a failed free; the result is deliberately ignored.
  if (api.ok()) (void)(*api)->cuMemFree(ptr_);
}

}  // namespace fusejit
