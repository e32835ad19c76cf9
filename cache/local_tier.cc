#include "cache/local_tier.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "cache/cache_dir.h"
#include "cache/entry_format.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

// bytes (stored under name) decoded, or why it is not a valid entry for `key` (nullptr: for the
// key its name says) with the reason to warn under.
absl::StatusOr<DecodedEntry> Decode(std::string_view bytes, const CacheKey* key,
                                    const std::string& name, std::string_view* reason) {
  absl::StatusOr<DecodedEntry> decoded = DecodeEntry(bytes);
  *reason = "entry-corrupt";
  if (!decoded.ok()) return decoded.status();
  *reason = "entry-foreign";
  if (key != nullptr) {
    if (absl::Status s = CheckKey(*key, decoded->key); !s.ok()) return s;
  } else if (decoded->key.EntryName() != name) {
    return absl::DataLossError(fmt::format("its header names entry {}", decoded->key.EntryName()));
  }
  return decoded;
}

}  // namespace

LocalTier::Lock& LocalTier::Lock::operator=(Lock&& o) noexcept {
  if (this != &o) {
    Release();
    store_ = std::exchange(o.store_, nullptr);
    name_ = std::move(o.name_);
    token_ = std::move(o.token_);
  }
  return *this;
}

void LocalTier::Lock::Release(bool delete_file) {
  if (store_ == nullptr) return;
  // A failed release leaves the lock to lapse (with its holder, or its ttl).
  (void)(delete_file ? store_->UnlockAndDelete(name_, token_) : store_->Unlock(name_, token_));
  store_ = nullptr;
}

LocalTier::LocalTier(std::shared_ptr<LocalStore> store, const CacheOptions& options,
                     Counters* counters, Warnings* warnings)
    : store_(std::move(store)), options_(options), counters_(counters), warnings_(warnings) {}

std::optional<std::string> LocalTier::Read(const CacheKey& key, const std::string& name,
                                           bool* refused, bool count) {
  absl::StatusOr<std::optional<std::string>> got = store_->Get(name);
  absl::Status problem;
  std::string reason;
  if (got.ok()) {
    if (!got->has_value()) return std::nullopt;
    std::string_view why;
    absl::StatusOr<DecodedEntry> decoded = Decode(**got, &key, name, &why);
    if (decoded.ok()) {
      counters_->hits_disk++;
      counters_->bytes_read += (*got)->size();
      if (!store_->read_only()) store_->Touch(name);
      return std::move(decoded->payload);
    }
    problem = decoded.status();
    reason = std::string(why);
  } else {
    problem = got.status();
    reason = StoreReason(problem, absl::IsPermissionDenied(problem) ? "entry-refused"
                                  : absl::IsDataLoss(problem)       ? "entry-corrupt"
                                                                    : "read-error");
  }
  const std::string path = store_->Locate(name);
  if (absl::IsPermissionDenied(problem) || absl::IsDataLoss(problem)) {
    const bool refuse = absl::IsPermissionDenied(problem);
    if (refuse) *refused = true;
    if (count) counters_->rejected_entries++;
    warnings_->Warn(reason,
                    refuse ? fmt::format("refusing cache entry {}: {}; that kernel is compiled and "
                                         "not cached",
                                         path, ErrorText(problem))
                           : fmt::format("cache entry {}: {}; recompiling and replacing it", path,
                                         ErrorText(problem)));
    return std::nullopt;
  }
  if (count) counters_->read_failures++;
  warnings_->Warn(
      reason, fmt::format("cannot read cache entry {}: {}; recompiling", path, ErrorText(problem)));
  return std::nullopt;
}

bool LocalTier::Publish(const CacheKey& key, const std::string& name, std::string_view payload) {
  if (!writable()) return false;
  const std::string bytes = EncodeEntry(key, payload);
  if (options_.max_bytes != 0 && bytes.size() > options_.max_bytes) {
    warnings_->Warn("too-large", fmt::format("a kernel of {} bytes exceeds the cache limit of {} "
                                             "bytes: not saved",
                                             bytes.size(), options_.max_bytes));
    return false;
  }
  absl::StatusOr<bool> written = store_->Put(name, bytes, Store::PutMode::kReplace);
  if (!written.ok()) {
    counters_->write_failures++;  // the store warned about it
    return false;
  }
  counters_->entries_written++;
  counters_->bytes_written += bytes.size();
  return true;
}

LocalTier::Lock LocalTier::Acquire(const std::string& name, absl::Time deadline,
                                   absl::FunctionRef<bool()> stop, bool* waited) {
  *waited = false;
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<std::optional<std::string>> token = store_->TryLock(name, options_.lock_timeout);
    if (!token.ok()) {
      counters_->lock_failures++;
      // PermissionDenied: the store found itself read-only and warned about that.
      if (!absl::IsPermissionDenied(token.status())) {
        warnings_->Warn("lock-failed", fmt::format("{}: compiling without the cross-process lock",
                                                   ErrorText(token.status())));
      }
      return Lock();
    }
    if (token->has_value()) return Lock(store_.get(), name, **std::move(token));
    *waited = true;
    if (stop()) return Lock();
    if (absl::Now() >= deadline) {
      counters_->lock_failures++;
      warnings_->Warn("lock-timeout",
                      fmt::format("gave up waiting for the lock on {} after the lock timeout: "
                                  "compiling without it",
                                  store_->Locate(name)));
      return Lock();
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

absl::Status LocalTier::Usable() const {
  if (usable()) return absl::OkStatus();
  const std::string where = store_->Describe();
  return absl::FailedPreconditionError(fmt::format(
      "kernel cache directory {}: {}", where.empty() ? "(none)" : where, store_->status_text()));
}

absl::StatusOr<std::vector<EntryInfo>> LocalTier::List() {
  if (store_->state() == DiskState::kMissing) return std::vector<EntryInfo>{};
  if (absl::Status s = Usable(); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> names = store_->List();
  if (!names.ok()) return names.status();
  std::sort(names->begin(), names->end());
  std::vector<EntryInfo> out;
  for (const std::string& name : *names) {
    absl::StatusOr<EntryStat> stat = store_->Stat(name);
    if (!stat.ok()) continue;  // deleted meanwhile
    EntryInfo e;
    e.name = name;
    e.file_bytes = stat->bytes;
    e.mtime_ns = stat->mtime_ns;
    e.atime_ns = stat->atime_ns;
    absl::StatusOr<std::optional<std::string>> got = store_->Get(name);
    if (got.ok() && !got->has_value()) continue;
    if (!got.ok()) {
      e.problem = ErrorText(got.status());
    } else {
      std::string_view reason;
      absl::StatusOr<DecodedEntry> decoded = Decode(**got, nullptr, name, &reason);
      if (decoded.ok()) {
        e.payload_bytes = decoded->payload.size();
        e.key = std::move(decoded->key);
      } else {
        e.problem = ErrorText(decoded.status());
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<VerifyReport> LocalTier::Verify(bool remove_bad) {
  VerifyReport report;
  if (store_->state() == DiskState::kMissing) return report;
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (remove_bad && store_->read_only()) {
    return absl::FailedPreconditionError(
        fmt::format("{} is read-only: cannot remove", store_->Describe()));
  }
  absl::StatusOr<std::vector<std::string>> names = store_->List();
  if (!names.ok()) return names.status();
  std::sort(names->begin(), names->end());
  for (const std::string& name : *names) {
    absl::StatusOr<std::optional<std::string>> got = store_->Get(name);
    if (got.ok() && !got->has_value()) continue;
    ++report.checked;
    absl::Status problem = got.status();
    if (got.ok()) {
      std::string_view reason;
      problem = Decode(**got, nullptr, name, &reason).status();
    }
    if (problem.ok()) {
      ++report.ok;
      continue;
    }
    report.bad.emplace_back(name, ErrorText(problem));
    if (remove_bad && store_->Remove(name).ok()) ++report.removed;
  }
  return report;
}

absl::StatusOr<size_t> LocalTier::Clear() { return store_->Clear(); }

absl::StatusOr<DiskUsage> LocalTier::Usage() { return store_->Usage(); }

absl::Status LocalTier::Trim() { return store_->Trim(); }

}  // namespace fusejit::cache
