// CacheDir's maintenance: eviction and sweeping (Trim), and what `fusejit cache` does to the
// directory (Clear, Usage); the tier lists and verifies entries (cache/local_tier.cc). Deletes
// only names the cache produces.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <limits>

#include <algorithm>
#include <tuple>

#include "absl/time/clock.h"
#include "cache/cache_dir.h"
#include "cache/entry_format.h"
#include "fmt/format.h"

namespace fusejit::cache {

void CacheDir::ReleaseKey(KeyLock& lock, const std::string& name) {
  if (lock.held() && writable()) {
    const std::string path = PathOf(LockFileName(name));
    absl::StatusOr<FileInfo> held = env_->Fstat(lock.fd());
    absl::StatusOr<FileInfo> now = env_->Lstat(path);
    if (held.ok() && now.ok() && held->dev == now->dev && held->ino == now->ino) {
      (void)env_->Unlink(path);  // a failure leaves the file to Trim's sweep
    }
  }
  lock.Release();
}

namespace {

// Whether the temp file `name` ("<entry>.tmp.<pid>.<serial>") was left by a process that no
// longer exists on this host (kill(pid, 0) fails with ESRCH). A pid of another host or pid
// namespace may look gone: callers also require an age no write takes (kOrphanTempAge).
bool WriterIsGone(std::string_view name) {
  const size_t start = name.find(".tmp.");
  if (start == std::string_view::npos) return false;
  const std::string_view rest = name.substr(start + 5);
  const std::string_view pid_text = rest.substr(0, rest.find('.'));
  int64_t pid = 0;
  auto [end, ec] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
  if (ec != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 1 ||
      pid == ::getpid() || pid > std::numeric_limits<pid_t>::max()) {
    return false;
  }
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

bool CacheDir::RemoveLockIfIdle(const std::string& entry_name) {
  const std::string path = PathOf(LockFileName(entry_name));
  absl::StatusOr<int> fd = env_->Open(path, O_RDWR | O_NOFOLLOW, 0);
  if (!fd.ok()) return false;
  KeyLock lock(env_, *fd);
  if (!env_->TryLock(*fd).ok()) return false;  // in use, or cannot tell: leave it
  // Holding the lock on the file at path: nobody else can delete or replace it now.
  absl::StatusOr<FileInfo> held = env_->Fstat(*fd);
  absl::StatusOr<FileInfo> now = env_->Lstat(path);
  if (!held.ok() || !now.ok() || held->dev != now->dev || held->ino != now->ino) return false;
  return env_->Unlink(path).ok();
}

absl::Status CacheDir::Usable() const {
  if (state_ == DiskState::kUsable) return absl::OkStatus();
  return absl::FailedPreconditionError(
      fmt::format("kernel cache directory {}: {}", root_.empty() ? "(none)" : root_, status_text_));
}

absl::Status CacheDir::Trim() {
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (read_only_) return absl::OkStatus();
  absl::MutexLock trim_lock(&trim_mu_);
  absl::StatusOr<std::vector<std::string>> names = env_->ListDir(root_);
  if (!names.ok()) {
    warnings_->Warn("list-error",
                    fmt::format("cannot list {} to trim it: {}", root_, ErrorText(names.status())));
    return names.status();
  }
  const int64_t now = absl::GetCurrentTimeNanos();
  const int64_t max_age = absl::ToInt64Nanoseconds(options_.temp_max_age);
  struct Entry {
    std::string name;
    uint64_t size;
    int64_t mtime;
  };
  std::vector<Entry> entries;
  absl::flat_hash_set<std::string> live;
  std::vector<std::string> old_locks;
  uint64_t total = 0;
  for (const std::string& name : *names) {
    const bool entry = IsEntryFileName(name), temp = IsTempFileName(name);
    const bool lock = IsLockFileName(name);
    if (!entry && !temp && !lock) continue;
    absl::StatusOr<FileInfo> info = env_->Lstat(PathOf(name));
    if (!info.ok() || info->type != FileInfo::Type::kRegular) continue;
    const bool old = now - info->mtime_ns > max_age;
    // Orphaned: its writer is gone (killed mid-write) and no write takes this long.
    const bool orphan = temp && now - info->mtime_ns > absl::ToInt64Nanoseconds(kOrphanTempAge) &&
                        WriterIsGone(name);
    if (entry) {
      entries.push_back({name, info->size, info->mtime_ns});
      live.insert(name);
      total += info->size;
    } else if (temp && (old || orphan)) {
      if (env_->Unlink(PathOf(name)).ok()) counters_->temp_files_swept++;
    } else if (temp) {
      total += info->size;
    } else if (lock && old) {
      old_locks.push_back(name);
    }
  }
  if (options_.max_bytes != 0 && total > options_.max_bytes) {
    const uint64_t target = options_.max_bytes - options_.max_bytes / 10;
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.mtime, a.name) < std::tie(b.mtime, b.name);
    });
    for (const Entry& e : entries) {
      if (total <= target) break;
      absl::Status s = env_->Unlink(PathOf(e.name));
      if (s.ok()) {
        counters_->evictions++;
        counters_->evicted_bytes += e.size;
        live.erase(e.name);
        RemoveLockIfIdle(e.name);
      } else if (ErrnoOf(s) != ENOENT) {
        warnings_->Warn("evict-error", fmt::format("cannot evict {}: {}", e.name, ErrorText(s)));
        continue;
      }
      total -= e.size;  // deleted, by us or by another process
    }
  }
  for (const std::string& lock : old_locks) {
    const std::string entry = lock.substr(0, 32) + std::string(kEntrySuffix);
    if (!live.contains(entry)) RemoveLockIfIdle(entry);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> CacheDir::Clear() {
  if (state_ == DiskState::kMissing) return 0;
  if (absl::Status s = Usable(); !s.ok()) return s;
  if (read_only_) return absl::FailedPreconditionError(fmt::format("{} is read-only", root_));
  absl::StatusOr<std::vector<std::string>> names = env_->ListDir(root_);
  if (!names.ok()) return names.status();
  size_t removed = 0, failed = 0;
  std::string first_failure;
  for (const std::string& name : *names) {
    if (IsEntryFileName(name) || IsTempFileName(name)) {
      absl::Status s = env_->Unlink(PathOf(name));
      if (s.ok()) {
        ++removed;
      } else if (ErrnoOf(s) != ENOENT && failed++ == 0) {
        first_failure = std::string(ErrorText(s));
      }
    }
  }
  for (const std::string& name : *names) {
    if (IsLockFileName(name) && RemoveLockIfIdle(name.substr(0, 32) + std::string(kEntrySuffix))) {
      ++removed;
    }
  }
  if (failed > 0) {
    return absl::InternalError(
        fmt::format("could not delete {} files in {}, first: {}", failed, root_, first_failure));
  }
  return removed;
}

absl::StatusOr<DiskUsage> CacheDir::Usage() {
  DiskUsage usage;
  if (state_ == DiskState::kMissing) return usage;
  if (absl::Status s = Usable(); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> names = env_->ListDir(root_);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const bool entry = IsEntryFileName(name), temp = IsTempFileName(name);
    if (IsLockFileName(name)) ++usage.lock_files;
    if (!entry && !temp) continue;
    absl::StatusOr<FileInfo> info = env_->Lstat(PathOf(name));
    if (!info.ok()) continue;
    if (entry) {
      ++usage.entries;
      usage.entry_bytes += info->size;
    } else {
      ++usage.temp_files;
      usage.temp_bytes += info->size;
    }
  }
  return usage;
}

}  // namespace fusejit::cache
