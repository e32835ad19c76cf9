#include "cache/dir_store.h"

#include <errno.h>

#include <utility>

#include "absl/time/clock.h"
#include "cache/entry_format.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

CacheOptions DirOptions(std::string dir, Env* env) {
  CacheOptions o;
  o.dir = std::move(dir);
  o.max_bytes = 0;  // no eviction: the store's owner decides what stays
  o.env = env;
  return o;
}

}  // namespace

DirStore::DirStore(std::string dir, Env* env)
    : options_(DirOptions(std::move(dir), env)),
      env_(env != nullptr ? env : PosixEnv()),
      dir_(options_, env_, &counters_, &warnings_) {
  dir_.Open();
}

absl::Status DirStore::Ping() {
  if (dir_.state() == DiskState::kUsable) return absl::OkStatus();
  return absl::UnavailableError(fmt::format("{}: {}", dir_.root(), dir_.status_text()));
}

absl::StatusOr<std::optional<std::string>> DirStore::Get(std::string_view name) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  ReadResult r = dir_.ReadRaw(std::string(name));
  switch (r.outcome) {
    case ReadResult::Outcome::kHit:
      return std::optional<std::string>(std::move(r.payload));
    case ReadResult::Outcome::kAbsent:
      return std::optional<std::string>();
    case ReadResult::Outcome::kRefused:
      return absl::PermissionDeniedError(
          fmt::format("refusing {}: {}", dir_.PathOf(name), r.problem));
    case ReadResult::Outcome::kCorrupt:
      return absl::DataLossError(fmt::format("{}: {}", dir_.PathOf(name), r.problem));
    case ReadResult::Outcome::kError:
      break;
  }
  return absl::UnavailableError(fmt::format("{}: {}", dir_.PathOf(name), r.problem));
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
  if (!dir_.PublishBytes(n, bytes)) {
    return absl::UnavailableError(fmt::format("could not write {}", dir_.PathOf(n)));
  }
  return true;
}

absl::StatusOr<std::optional<std::string>> DirStore::TryLock(std::string_view name,
                                                             absl::Duration ttl) {
  if (absl::Status s = Ping(); !s.ok()) return s;
  bool busy = false;
  KeyLock lock = dir_.LockKey(std::string(name), absl::Now(), [] { return true; }, &busy);
  if (!lock.held()) {
    if (busy) return std::optional<std::string>();
    return absl::UnavailableError(fmt::format("cannot lock {} in {}", name, dir_.root()));
  }
  absl::MutexLock l(&mu_);
  std::string token = fmt::format("{}:{}", name, ++serial_);
  locks_.emplace(token, std::move(lock));
  return std::optional<std::string>(std::move(token));
}

absl::Status DirStore::Unlock(std::string_view name, std::string_view token) {
  KeyLock lock;
  {
    absl::MutexLock l(&mu_);
    auto it = locks_.find(std::string(token));
    if (it == locks_.end()) return absl::OkStatus();  // not ours (any more)
    lock = std::move(it->second);
    locks_.erase(it);
  }
  lock.Release();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> DirStore::List() {
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
  absl::Status s = env_->Unlink(dir_.PathOf(name));
  return s.ok() || ErrnoOf(s) == ENOENT ? absl::OkStatus() : s;
}

absl::StatusOr<StoreUsage> DirStore::Usage() {
  absl::StatusOr<DiskUsage> u = dir_.Usage();
  if (!u.ok()) return u.status();
  return StoreUsage{u->entries, u->entry_bytes};
}

}  // namespace fusejit::cache
