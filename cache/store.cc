#include "cache/store.h"

#include <utility>

#include "absl/strings/cord.h"

namespace fusejit::cache {
namespace {
constexpr char kReasonPayload[] = "fusejit.cache/reason";
}  // namespace

std::string StoreReason(const absl::Status& status, std::string_view fallback) {
  auto payload = status.GetPayload(kReasonPayload);
  return payload.has_value() ? std::string(*payload) : std::string(fallback);
}

absl::Status WithStoreReason(absl::Status status, std::string_view reason) {
  status.SetPayload(kReasonPayload, absl::Cord(absl::string_view(reason.data(), reason.size())));
  return status;
}

}  // namespace fusejit::cache
