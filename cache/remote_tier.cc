#include "cache/remote_tier.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "cache/cache_dir.h"
#include "cache/entry_format.h"
#include "cache/redis_store.h"
#include "fmt/format.h"

namespace fusejit::cache {

RemoteTier::Lock& RemoteTier::Lock::operator=(Lock&& o) noexcept {
  if (this != &o) {
    Release();
    tier_ = std::exchange(o.tier_, nullptr);
    name_ = std::move(o.name_);
    token_ = std::move(o.token_);
  }
  return *this;
}

void RemoteTier::Lock::Release() {
  if (tier_ == nullptr) return;
  // A failed release only leaves the lock to lapse at its TTL; waiters poll for the entry.
  absl::Status s = tier_->store_->Unlock(name_, token_);
  if (!s.ok()) tier_->Failed(s);
  tier_ = nullptr;
}

RemoteTier::RemoteTier(RemoteOptions options, Counters* counters, Warnings* warnings)
    : options_(std::move(options)), counters_(counters), warnings_(warnings) {
  store_ = options_.store;
  if (store_ == nullptr) {
    store_ = std::make_shared<RedisStore>(
        options_, [warnings](std::string_view reason, std::string_view message) {
          warnings->Warn(reason, message);
        });
  }
}

void RemoteTier::Failed(const absl::Status& status) {
  counters_->remote_errors++;
  // Unavailable and PermissionDenied are warned about by the store (once); the rest here.
  if (!absl::IsUnavailable(status) && !absl::IsPermissionDenied(status) &&
      !absl::IsResourceExhausted(status)) {
    warnings_->Warn("remote-error", fmt::format("remote cache {}: {}", store_->Describe(),
                                                ErrorText(status)));
  }
}

std::optional<std::string> RemoteTier::Fetch(const CacheKey& key, const std::string& name,
                                             bool* bad, bool count) {
  absl::StatusOr<std::optional<std::string>> value = store_->Get(name);
  if (!value.ok()) {
    if (count) Failed(value.status());
    return std::nullopt;
  }
  const bool counted = count && !options_.read_only;
  if (!value->has_value()) {
    if (count) counters_->remote_misses++;
    if (counted) store_->Count("misses");
    return std::nullopt;
  }
  const std::string& bytes = **value;
  absl::Status problem;
  std::string_view reason = "remote-corrupt";
  absl::StatusOr<DecodedEntry> decoded;
  if (bytes.size() > options_.max_value_bytes) {
    problem = absl::DataLossError(fmt::format("{} bytes is over the cap of {} bytes",
                                              bytes.size(), options_.max_value_bytes));
  } else {
    decoded = DecodeEntry(bytes);
    if (!decoded.ok()) {
      problem = decoded.status();
    } else if (absl::Status s = CheckKey(key, decoded->key); !s.ok()) {
      problem = s;
      reason = "remote-foreign";
    }
  }
  if (!problem.ok()) {
    *bad = true;
    if (count) {
      counters_->remote_rejected++;
      if (counted) store_->Count("rejected");
      warnings_->Warn(reason, fmt::format("remote cache value {}{} in {}: {}; recompiling and "
                                          "republishing it",
                                          options_.prefix, name, store_->Describe(),
                                          ErrorText(problem)));
    }
    return std::nullopt;
  }
  counters_->remote_hits++;
  counters_->remote_bytes_read += bytes.size();
  if (!options_.read_only) store_->Count("hits");
  return std::move(decoded->payload);
}

void RemoteTier::Publish(const CacheKey& key, const std::string& name, std::string_view payload,
                         bool replace) {
  if (options_.read_only) return;
  const std::string bytes = EncodeEntry(key, payload);
  if (bytes.size() > options_.max_value_bytes) {
    counters_->remote_write_failures++;
    warnings_->Warn("remote-too-large",
                    fmt::format("a kernel of {} bytes is over the remote cache's cap of {} bytes "
                                "(FUSEJIT_REMOTE_CACHE_MAX_VALUE_BYTES): not published",
                                bytes.size(), options_.max_value_bytes));
    return;
  }
  absl::StatusOr<bool> written =
      store_->Put(name, bytes, replace ? Store::PutMode::kReplace : Store::PutMode::kIfAbsent);
  if (!written.ok()) {
    counters_->remote_write_failures++;
    Failed(written.status());
    return;
  }
  if (*written) {
    counters_->remote_published++;
    counters_->remote_bytes_written += bytes.size();
    store_->Count("published");
  }
}

RemoteTier::Lock RemoteTier::Acquire(const std::string& name, absl::Time deadline,
                                     absl::FunctionRef<bool()> stop, bool* waited) {
  *waited = false;
  if (options_.read_only) return Lock();
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    absl::StatusOr<std::optional<std::string>> token = store_->TryLock(name, options_.lock_ttl);
    if (!token.ok()) {
      Failed(token.status());
      return Lock();
    }
    if (token->has_value()) return Lock(this, name, **token);
    if (!*waited) {
      *waited = true;
      counters_->remote_lock_waits++;
    }
    if (stop() || absl::Now() + backoff > deadline) return Lock();
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(100));
  }
}

}  // namespace fusejit::cache
