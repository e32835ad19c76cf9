// KernelCache's remote tier as `fusejit cache` shows and checks it (the lookups are in
// kernel_cache.cc).
#include <algorithm>
#include <utility>

#include "cache/cache_dir.h"
#include "cache/entry_format.h"
#include "cache/kernel_cache.h"
#include "cache/local_tier.h"
#include "cache/remote_tier.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

absl::Status NoRemote() {
  return absl::FailedPreconditionError(
      "no remote cache: set FUSEJIT_REMOTE_CACHE=redis://[[user]:password@]host[:port][/db] or "
      "unix:///path/to/redis.sock");
}

}  // namespace

void KernelCache::KeepRemoteHit(const CacheKey& key, const std::string& name,
                                std::string_view payload) {
  LocalTier& d = local();
  if (!d.writable()) return;
  if (d.Publish(key, name, payload)) (void)d.Trim();  // faults are counted and warned about
}

std::string KernelCache::remote_description() const {
  if (remote_ == nullptr) return "none";
  return remote_->store().Describe() + (remote_->read_only() ? " (read-only)" : "");
}

absl::Status KernelCache::RemotePing() {
  if (remote_ == nullptr) return NoRemote();
  return remote_->store().Ping();
}

absl::StatusOr<StoreUsage> KernelCache::RemoteUsage() {
  if (remote_ == nullptr) return NoRemote();
  return remote_->store().Usage();
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> KernelCache::RemoteCounters() {
  if (remote_ == nullptr) return NoRemote();
  return remote_->store().Counters();
}

absl::StatusOr<VerifyReport> KernelCache::VerifyRemote(bool remove_bad) {
  if (remote_ == nullptr) return NoRemote();
  if (remove_bad && remote_->read_only()) {
    return absl::FailedPreconditionError(
        "the remote cache is read-only here (FUSEJIT_REMOTE_CACHE_READONLY): cannot remove");
  }
  Store& store = remote_->store();
  absl::StatusOr<std::vector<std::string>> names = store.List();
  if (!names.ok()) return names.status();
  std::sort(names->begin(), names->end());
  VerifyReport report;
  for (const std::string& name : *names) {
    absl::StatusOr<std::optional<std::string>> value = store.Get(name);
    if (!value.ok()) return value.status();
    if (!value->has_value()) continue;  // deleted or evicted meanwhile
    ++report.checked;
    std::string problem;
    if ((*value)->size() > remote_->options().max_value_bytes) {
      problem = fmt::format("{} bytes is over the cap of {} bytes", (*value)->size(),
                            remote_->options().max_value_bytes);
    } else if (absl::StatusOr<DecodedEntry> d = DecodeEntry(**value); !d.ok()) {
      problem = ErrorText(d.status());
    } else if (d->key.EntryName() != name) {
      problem = fmt::format("its header names entry {}", d->key.EntryName());
    }
    if (problem.empty()) {
      ++report.ok;
      continue;
    }
    report.bad.emplace_back(name, problem);
    if (remove_bad && store.Remove(name).ok()) ++report.removed;
  }
  return report;
}

}  // namespace fusejit::cache
