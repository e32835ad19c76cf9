#include "cache/cache_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/entry_format.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

constexpr std::string_view kLockSuffix = ".lock";
constexpr std::string_view kTempInfix = ".tmp.";
// Entry files larger than this are not read: min(4 GiB, max(max_bytes, 64 MiB)).
constexpr uint64_t kMaxEntryFileBytes = uint64_t{4} << 30;
constexpr uint64_t kMinReadLimit = uint64_t{64} << 20;

bool IsHex32(std::string_view s) {
  if (s.size() != 32) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool IsPermissionErrno(int err) { return err == EROFS || err == EACCES || err == EPERM; }

}  // namespace

std::string LockFileName(std::string_view entry_name) {
  return std::string(entry_name.substr(0, 32)) + std::string(kLockSuffix);
}

bool IsLockFileName(std::string_view name) {
  return name.size() == 32 + kLockSuffix.size() && IsHex32(name.substr(0, 32)) &&
         name.substr(32) == kLockSuffix;
}

bool IsTempFileName(std::string_view name) {
  const size_t n = 32 + kEntrySuffix.size();
  return name.size() > n + kTempInfix.size() && IsEntryFileName(name.substr(0, n)) &&
         name.substr(n, kTempInfix.size()) == kTempInfix;
}

Warnings::Warnings(std::function<void(std::string_view)> sink) : sink_(std::move(sink)) {}

void Warnings::Warn(std::string_view reason, std::string_view message) {
  {
    absl::MutexLock lock(&mu_);
    if (!seen_.emplace(reason).second) return;
  }
  const std::string line = "fusejit cache: " + std::string(message);
  if (sink_) {
    sink_(line);
  } else {
    fmt::print(stderr, "{}\n", line);
    std::fflush(stderr);
  }
}

KeyLock& KeyLock::operator=(KeyLock&& other) noexcept {
  if (this != &other) {
    Release();
    env_ = other.env_;
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void KeyLock::Release() {
  if (fd_ < 0) return;
  // Closing releases the flock whatever close reports; there is nothing to undo on failure.
  (void)env_->Close(fd_);
  fd_ = -1;
}

CacheDir::CacheDir(const CacheOptions& options, Env* env, Counters* counters, Warnings* warnings)
    : options_(options), env_(env), counters_(counters), warnings_(warnings) {}

std::string CacheDir::PathOf(std::string_view file_name) const {
  return root_ + "/" + std::string(file_name);
}

void CacheDir::Refuse(DiskState state, std::string_view reason, std::string message) {
  state_ = state;
  status_text_ = message;
  warnings_->Warn(reason, message + "; kernels are compiled and not cached");
}

absl::Status CacheDir::MakeParents(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    const std::string prefix = path.substr(0, pos);
    absl::StatusOr<FileInfo> info = env_->Lstat(prefix);
    if (info.ok()) continue;
    if (ErrnoOf(info.status()) != ENOENT) return info.status();
    absl::Status s = env_->Mkdir(prefix, 0700);
    if (!s.ok() && ErrnoOf(s) != EEXIST) return s;
  }
  return absl::OkStatus();
}

void CacheDir::Open() {
  if (!options_.disk_enabled) {
    state_ = DiskState::kDisabled;
    status_text_ = "disabled";
    return;
  }
  uid_ = env_->EffectiveUid();
  std::string dir = options_.dir;
  // A folder that must exist already for the cache to be created below it: $HOME (or the parent
  // of $XDG_CACHE_HOME), so that no cache is created under a home that does not exist.
  std::string base;
  if (dir.empty()) {
    std::optional<std::string> v = env_->GetVar("FUSEJIT_CACHE_DIR");
    std::optional<std::string> xdg = env_->GetVar("XDG_CACHE_HOME");
    std::optional<std::string> home = env_->GetVar("HOME");
    if (v.has_value() && !v->empty()) {
      dir = *v;
    } else if (xdg.has_value() && absl::StartsWith(*xdg, "/")) {
      dir = absl::StrCat(*xdg, "/fusejit");
      std::string x = *xdg;
      while (x.size() > 1 && x.back() == '/') x.pop_back();
      const size_t slash = x.rfind('/');
      base = slash == 0 ? "/" : x.substr(0, slash);  // the parent of XDG_CACHE_HOME
    } else if (home.has_value() && absl::StartsWith(*home, "/")) {
      dir = absl::StrCat(*home, "/.cache/fusejit");
      base = *home;
    }
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) {
    Refuse(DiskState::kNoDirectory, "no-directory",
           "no cache directory: FUSEJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset or relative");
    return;
  }
  // Relative paths are refused, as XDG_CACHE_HOME and HOME are: processes started in different
  // folders would each use (and create) a different cache. Tools absolutize their --cache-dir.
  if (dir[0] != '/') {
    Refuse(DiskState::kNoDirectory, "relative-directory",
           fmt::format("refusing cache directory '{}': a relative path (FUSEJIT_CACHE_DIR must be "
                       "absolute, like XDG_CACHE_HOME and HOME)",
                       dir));
    return;
  }
  root_ = dir;

  absl::StatusOr<FileInfo> info = env_->Lstat(root_);
  if (!info.ok() && ErrnoOf(info.status()) == ENOENT) {
    if (!options_.create_directory) {
      state_ = DiskState::kMissing;
      status_text_ = absl::StrCat(root_, " does not exist");
      return;
    }
    if (!base.empty()) {
      absl::StatusOr<FileInfo> home = env_->Lstat(base);
      if (!home.ok() || (home->type != FileInfo::Type::kDirectory &&
                         home->type != FileInfo::Type::kSymlink)) {
        Refuse(DiskState::kNoDirectory, "home-missing",
               fmt::format("no cache directory: {} does not exist (or is not a directory), so {} "
                           "is not created below it",
                           base, root_));
        return;
      }
    }
    absl::Status s = MakeParents(root_);
    if (s.ok()) {
      s = env_->Mkdir(root_, 0700);
      if (s.ok()) {
        s = env_->Chmod(root_, 0700);  // exactly 0700 whatever the umask
      } else if (ErrnoOf(s) == EEXIST) {
        s = absl::OkStatus();  // another process created it: checked below like any other
      }
    }
    if (!s.ok()) {
      Refuse(DiskState::kFailed, "create-failed",
             fmt::format("cannot create cache directory {}: {}", root_, ErrorText(s)));
      return;
    }
    info = env_->Lstat(root_);
  }
  if (!info.ok()) {
    Refuse(DiskState::kFailed, "stat-failed",
           fmt::format("cannot examine cache directory {}: {}", root_, ErrorText(info.status())));
    return;
  }
  if (info->type == FileInfo::Type::kSymlink) {
    Refuse(DiskState::kRefused, "root-symlink",
           fmt::format("refusing cache directory {}: it is a symbolic link", root_));
    return;
  }
  if (info->type != FileInfo::Type::kDirectory) {
    Refuse(DiskState::kRefused, "root-not-directory",
           fmt::format("refusing cache directory {}: it is not a directory", root_));
    return;
  }
  if (info->uid != uid_) {
    Refuse(DiskState::kRefused, "root-owner",
           fmt::format("refusing cache directory {}: owned by uid {}, not by this user (uid {})",
                       root_, info->uid, uid_));
    return;
  }
  if ((info->mode & 022) != 0) {
    Refuse(DiskState::kRefused, "root-permissions",
           fmt::format("refusing cache directory {}: writable by group or others (mode {:04o}; "
                       "chmod 700 it)",
                       root_, info->mode));
    return;
  }
  state_ = DiskState::kUsable;
  read_only_ = options_.read_only;
  status_text_ = options_.read_only ? "usable, read-only" : "usable";
}

ReadResult CacheDir::ReadRaw(const std::string& name) {
  using Outcome = ReadResult::Outcome;
  ReadResult r;
  const std::string path = PathOf(name);
  auto fail = [&](Outcome outcome, std::string_view reason, std::string problem) {
    r.outcome = outcome;
    r.reason = std::string(reason);
    r.problem = std::move(problem);
    r.payload.clear();
    return std::move(r);
  };
  // O_NOFOLLOW: a symlink fails with ELOOP. O_NONBLOCK: a planted FIFO cannot block the open.
  absl::StatusOr<int> fd = env_->Open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, 0);
  if (!fd.ok()) {
    const int err = ErrnoOf(fd.status());
    if (err == ENOENT) return r;
    if (err == ELOOP) {
      return fail(Outcome::kRefused, "entry-symlink", "a symbolic link");
    }
    return fail(Outcome::kError, "read-error", ErrorText(fd.status()));
  }
  // A failed close of a descriptor only read from cannot affect what was read.
  absl::Cleanup close_fd = [&] { (void)env_->Close(*fd); };
  absl::StatusOr<FileInfo> info = env_->Fstat(*fd);
  if (!info.ok()) return fail(Outcome::kError, "read-error", ErrorText(info.status()));
  if (info->type != FileInfo::Type::kRegular) {
    return fail(Outcome::kRefused, "entry-not-regular", "not a regular file");
  }
  if (info->uid != uid_) {
    return fail(Outcome::kRefused, "entry-owner",
                fmt::format("owned by uid {}, not by this user (uid {})", info->uid, uid_));
  }
  if ((info->mode & 022) != 0) {
    return fail(Outcome::kRefused, "entry-permissions",
                fmt::format("writable by group or others (mode {:04o})", info->mode));
  }
  // Publish never writes an entry over the limit; this bounds what a planted file can cost.
  const uint64_t max_size =
      options_.max_bytes == 0
          ? kMaxEntryFileBytes
          : std::min(kMaxEntryFileBytes, std::max(options_.max_bytes, kMinReadLimit));
  if (info->size > max_size) {
    return fail(Outcome::kCorrupt, "entry-corrupt",
                fmt::format("{} bytes is more than an entry can be", info->size));
  }
  std::string bytes(info->size, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    absl::StatusOr<size_t> n = env_->Read(*fd, bytes.data() + got, bytes.size() - got);
    if (!n.ok()) {
      return fail(Outcome::kError, "read-error", ErrorText(n.status()));
    }
    if (*n == 0) break;
    got += *n;
  }
  bytes.resize(got);
  r.outcome = Outcome::kHit;
  r.payload = std::move(bytes);
  return r;
}

absl::StatusOr<KeyLock> CacheDir::TryLockKey(const std::string& name) {
  const std::string path = PathOf(LockFileName(name));
  auto failed = [&](const absl::Status& s) {
    std::string message = fmt::format("cannot lock {} ({})", path, ErrorText(s));
    if (IsPermissionErrno(ErrnoOf(s))) {
      NoteReadOnly(s);
      return absl::PermissionDeniedError(std::move(message));
    }
    return absl::UnavailableError(std::move(message));
  };
  // Retried when a deleter (Trim, Clear) unlinked the lock file between our open and flock.
  for (int attempt = 0; attempt < 16; ++attempt) {
    absl::StatusOr<int> fd = env_->Open(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0600);
    if (!fd.ok()) return failed(fd.status());
    KeyLock lock(env_, *fd);  // closes fd on every return below but the successful one
    absl::Status s = env_->TryLock(*fd);
    if (!s.ok()) {
      if (ErrnoOf(s) == EWOULDBLOCK) return KeyLock();
      return failed(s);
    }
    absl::StatusOr<FileInfo> held = env_->Fstat(*fd);
    if (!held.ok()) return failed(held.status());
    absl::StatusOr<FileInfo> now = env_->Lstat(path);
    if (now.ok() && now->dev == held->dev && now->ino == held->ino) return lock;
    if (!now.ok() && ErrnoOf(now.status()) != ENOENT) return failed(now.status());
  }
  return failed(absl::UnavailableError("the lock file was replaced 16 times in a row"));
}

void CacheDir::NoteReadOnly(const absl::Status& status) {
  read_only_ = true;
  warnings_->Warn("read-only", fmt::format("cache directory {} is not writable ({}): cached "
                                           "kernels are read, new ones are not saved",
                                           root_, ErrorText(status)));
}

void CacheDir::PublishFailed(const absl::Status& status, std::string_view step) {
  const int err = ErrnoOf(status);
  if (IsPermissionErrno(err)) {
    NoteReadOnly(status);
  } else if (err == ENOSPC || err == EDQUOT) {
    warnings_->Warn("disk-full", fmt::format("no space for the kernel cache in {} ({}): new "
                                             "kernels are not saved",
                                             root_, ErrorText(status)));
  } else {
    warnings_->Warn("write-error", fmt::format("could not save a kernel in {} ({}: {})", root_,
                                               step, ErrorText(status)));
  }
}

absl::Status CacheDir::PublishBytes(const std::string& name, std::string_view bytes) {
  if (!writable()) {
    return absl::PermissionDeniedError(fmt::format("cache directory {} is read-only", root_));
  }
  std::string tmp;
  int fd = -1;
  for (int i = 0;; ++i) {
    tmp = PathOf(fmt::format("{}{}{}.{}", name, kTempInfix, ::getpid(), temp_serial_++));
    absl::StatusOr<int> r = env_->Open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (r.ok()) {
      fd = *r;
      break;
    }
    if (ErrnoOf(r.status()) != EEXIST || i == 3) {
      PublishFailed(r.status(), "create temp file");
      return r.status();
    }
  }
  absl::Status s;
  std::string_view step = "write";
  for (size_t done = 0; s.ok() && done < bytes.size();) {
    absl::StatusOr<size_t> n = env_->Write(fd, bytes.data() + done, bytes.size() - done);
    if (!n.ok()) {
      s = n.status();
    } else if (*n == 0) {
      s = ErrnoStatus(EIO, "write (0 bytes written)", tmp);
    } else {
      done += *n;
    }
  }
  if (s.ok()) {
    step = "fsync";
    s = env_->Fsync(fd);
  }
  absl::Status closed = env_->Close(fd);
  if (s.ok() && !closed.ok()) {
    step = "close";
    s = closed;
  }
  if (s.ok()) {
    step = "rename";
    s = env_->Rename(tmp, PathOf(name));
  }
  if (!s.ok()) {
    absl::Status u = env_->Unlink(tmp);
    if (!u.ok() && ErrnoOf(u) != ENOENT) {
      warnings_->Warn("temp-unlink", fmt::format("could not delete temp file {} ({}): it will be "
                                                 "swept later",
                                                 tmp, ErrorText(u)));
    }
    PublishFailed(s, step);
    return s;
  }
  // Make the rename durable. The entry is already whole and visible whatever happens here.
  absl::StatusOr<int> dir_fd = env_->Open(root_, O_RDONLY | O_DIRECTORY, 0);
  absl::Status synced = dir_fd.status();
  if (dir_fd.ok()) {
    synced = env_->Fsync(*dir_fd);
    absl::Status c = env_->Close(*dir_fd);
    if (synced.ok()) synced = c;
  }
  if (!synced.ok()) {
    counters_->write_failures++;
    warnings_->Warn("dir-fsync", fmt::format("could not fsync cache directory {} ({}): entries "
                                             "may be lost on a crash",
                                             root_, ErrorText(synced)));
  }
  return absl::OkStatus();
}

void CacheDir::Touch(const std::string& name) {
  if (!writable()) return;
  // A failure only ages the entry for LRU; a read-only directory also stops further writes.
  absl::Status s = env_->TouchMtime(PathOf(name));
  if (!s.ok() && IsPermissionErrno(ErrnoOf(s))) NoteReadOnly(s);
}

}  // namespace fusejit::cache
