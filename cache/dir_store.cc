#include "cache/dir_store.h"

#include <errno.h>

#include <utility>

#include "cache/entry_format.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

CacheOptions SharedDirOptions(std::string dir, Env* env) {
  CacheOptions o;
  o.dir = std::move(dir);
  o.max_bytes = 0;  // no eviction: the store's owner decides what stays
  o.env = env;
  return o;
}

// The directory's part of options (not the tiers above it).
CacheOptions DirOptions(const CacheOptions& options) {
  CacheOptions o = options;
  o.warn = nullptr;
  o.remote.reset();
  o.store.reset();
  return o;
}

}  // namespace

DirStore::DirStore(std::string dir, Env* env)
    : options_(SharedDirOptions(std::move(dir), env)),
      env_(env != nullptr ? env : PosixEnv()),
      dir_(options_, env_, &own_counters_, &own_warnings_) {
  dir_.Open();
}

DirStore::DirStore(const CacheOptions& options, ::fusejit::cache::Counters* counters,
                   Warnings* warnings)
    : options_(DirOptions(options)),
      env_(options.env != nullptr ? options.env : PosixEnv()),
      dir_(options_, env_, counters != nullptr ? counters : &own_counters_,
           warnings != nullptr ? warnings : &own_warnings_) {
  dir_.Open();
}

absl::Status DirStore::Ping() {
  if (dir_.state() == DiskState::kUsable) return absl::OkStatus();
  return absl::UnavailableError(fmt::format("{}: {}", dir_.root(), dir_.status_text()));
}

absl::StatusOr<std::optional<std::string>> DirStore::Get(std::string_view name) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  ReadResult r = dir_.ReadRaw(std::string(name));
  absl::Status failure;
  switch (r.outcome) {
    case ReadResult::Outcome::kHit:
      return std::optional<std::string>(std::move(r.payload));
    case ReadResult::Outcome::kAbsent:
      return std::optional<std::string>();
    case ReadResult::Outcome::kRefused:
      failure = absl::PermissionDeniedError(r.problem);
      break;
    case ReadResult::Outcome::kCorrupt:
      failure = absl::DataLossError(r.problem);
      break;
    case ReadResult::Outcome::kError:
      failure = absl::UnavailableError(r.problem);
      break;
  }
  return WithStoreReason(std::move(failure), r.reason);
}

absl::StatusOr<bool> DirStore::Put(std::string_view name, std::string_view bytes, PutMode mode) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  const std::string n(name);
  if (mode == PutMode::kIfAbsent) {
    absl::StatusOr<FileInfo> info = env_->Lstat(dir_.PathOf(n));
    if (info.ok()) return false;
    if (ErrnoOf(info.status()) != ENOENT) return info.status();
    // Two writers racing here both publish whole entries atomically; the later one stays.
  }
  if (absl::Status s = dir_.PublishBytes(n, bytes); !s.ok()) return s;
  return true;
}

absl::StatusOr<std::optional<std::string>> DirStore::TryLock(std::string_view name,
                                                             absl::Duration ttl) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  if (!dir_.writable()) {
    return absl::PermissionDeniedError(fmt::format("{} is read-only", dir_.root()));
  }
  absl::StatusOr<KeyLock> lock = dir_.TryLockKey(std::string(name));
  if (!lock.ok()) return lock.status();
  if (!lock->held()) return std::optional<std::string>();
  absl::MutexLock l(&mu_);
  std::string token = fmt::format("{}:{}", name, ++serial_);
  locks_.emplace(token, *std::move(lock));
  return std::optional<std::string>(std::move(token));
}

void DirStore::Release(std::string_view name, std::string_view token, bool delete_file) {
  KeyLock lock;
  {
    absl::MutexLock l(&mu_);
    auto it = locks_.find(std::string(token));
    if (it == locks_.end()) return;  // not ours (any more)
    lock = std::move(it->second);
    locks_.erase(it);
  }
  if (delete_file) dir_.ReleaseKey(lock, std::string(name));
  lock.Release();
}

absl::Status DirStore::Unlock(std::string_view name, std::string_view token) {
  Release(name, token, /*delete_file=*/false);
  return absl::OkStatus();
}

absl::Status DirStore::UnlockAndDelete(std::string_view name, std::string_view token) {
  Release(name, token, /*delete_file=*/true);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> DirStore::List() {
  if (dir_.state() == DiskState::kMissing) return std::vector<std::string>{};
  if (absl::Status s = Ping(); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> names = env_->ListDir(dir_.root());
  if (!names.ok()) return names.status();
  std::vector<std::string> out;
  for (std::string& n : *names) {
    if (IsEntryFileName(n)) out.push_back(std::move(n));
  }
  return out;
}

absl::Status DirStore::Remove(std::string_view name) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  if (!dir_.writable()) {
    return absl::PermissionDeniedError(fmt::format("{} is read-only", dir_.root()));
  }
  absl::Status s = env_->Unlink(dir_.PathOf(name));
  return s.ok() || ErrnoOf(s) == ENOENT ? absl::OkStatus() : s;
}

absl::StatusOr<StoreUsage> DirStore::Usage() { return dir_.Usage(); }

absl::StatusOr<EntryStat> DirStore::Stat(std::string_view name) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  absl::StatusOr<FileInfo> info = env_->Lstat(dir_.PathOf(name));
  if (!info.ok()) return info.status();
  return EntryStat{info->size, info->mtime_ns, info->atime_ns};
}

}  // namespace fusejit::cache
