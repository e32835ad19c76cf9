#include "cache/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fusejit::cache {
namespace {

constexpr char kErrnoPayload[] = "fusejit.cache/errno";

FileInfo ToFileInfo(const struct stat& st) {
  FileInfo info;
  if (S_ISREG(st.st_mode)) {
    info.type = FileInfo::Type::kRegular;
  } else if (S_ISDIR(st.st_mode)) {
    info.type = FileInfo::Type::kDirectory;
  } else if (S_ISLNK(st.st_mode)) {
    info.type = FileInfo::Type::kSymlink;
  }
  info.mode = st.st_mode & 07777;
  info.uid = st.st_uid;
  info.size = static_cast<uint64_t>(st.st_size);
  info.dev = st.st_dev;
  info.ino = st.st_ino;
  info.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  info.atime_ns = int64_t{st.st_atim.tv_sec} * 1000000000 + st.st_atim.tv_nsec;
  return info;
}

class PosixEnvImpl final : public Env {
 public:
  absl::StatusOr<int> Open(const std::string& path, int flags, uint32_t mode) override {
    int fd;
    do {
      fd = ::open(path.c_str(), flags | O_CLOEXEC, static_cast<mode_t>(mode));
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    return fd;
  }

  absl::StatusOr<size_t> Read(int fd, char* buf, size_t n) override {
    ssize_t r;
    do {
      r = ::read(fd, buf, n);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return ErrnoStatus(errno, "read", absl::StrCat("fd ", fd));
    return static_cast<size_t>(r);
  }

  absl::StatusOr<size_t> Write(int fd, const char* buf, size_t n) override {
    ssize_t r;
    do {
      r = ::write(fd, buf, n);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return ErrnoStatus(errno, "write", absl::StrCat("fd ", fd));
    return static_cast<size_t>(r);
  }

  absl::Status Fsync(int fd) override {
    if (::fsync(fd) != 0) return ErrnoStatus(errno, "fsync", absl::StrCat("fd ", fd));
    return absl::OkStatus();
  }

  absl::Status Close(int fd) override {
    // Linux releases the descriptor even when close fails; never retry (EINTR included).
    if (::close(fd) != 0) return ErrnoStatus(errno, "close", absl::StrCat("fd ", fd));
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, "rename", absl::StrCat(from, " -> ", to));
    }
    return absl::OkStatus();
  }

  absl::Status Mkdir(const std::string& path, uint32_t mode) override {
    if (::mkdir(path.c_str(), static_cast<mode_t>(mode)) != 0) {
      return ErrnoStatus(errno, "mkdir", path);
    }
    return absl::OkStatus();
  }

  absl::Status Chmod(const std::string& path, uint32_t mode) override {
    if (::fchmodat(AT_FDCWD, path.c_str(), static_cast<mode_t>(mode), 0) != 0) {
      return ErrnoStatus(errno, "chmod", path);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<FileInfo> Lstat(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "lstat", path);
    return ToFileInfo(st);
  }

  absl::StatusOr<FileInfo> Fstat(int fd) override {
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat", absl::StrCat("fd ", fd));
    return ToFileInfo(st);
  }

  absl::Status Unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, "unlink", path);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoStatus(errno, "opendir", path);
    std::vector<std::string> names;
    while (true) {
      errno = 0;
      struct dirent* e = ::readdir(dir);
      if (e == nullptr) break;
      std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    const int err = errno;
    ::closedir(dir);
    if (err != 0) return ErrnoStatus(err, "readdir", path);
    return names;
  }

  absl::Status TryLock(int fd) override {
    int r;
    do {
      r = ::flock(fd, LOCK_EX | LOCK_NB);
    } while (r != 0 && errno == EINTR);
    if (r != 0) return ErrnoStatus(errno, "flock", absl::StrCat("fd ", fd));
    return absl::OkStatus();
  }

  absl::Status TouchMtime(const std::string& path) override {
    struct timespec times[2];
    times[0].tv_sec = 0;
    times[0].tv_nsec = UTIME_OMIT;
    times[1].tv_sec = 0;
    times[1].tv_nsec = UTIME_NOW;
    if (::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoStatus(errno, "utimensat", path);
    }
    return absl::OkStatus();
  }

  uint32_t EffectiveUid() override { return ::geteuid(); }

  std::optional<std::string> GetVar(const char* name) override {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  }
};

}  // namespace

std::string_view EnvOpName(EnvOp op) {
  switch (op) {
    case EnvOp::kOpen:
      return "open";
    case EnvOp::kRead:
      return "read";
    case EnvOp::kWrite:
      return "write";
    case EnvOp::kFsync:
      return "fsync";
    case EnvOp::kClose:
      return "close";
    case EnvOp::kRename:
      return "rename";
    case EnvOp::kMkdir:
      return "mkdir";
    case EnvOp::kChmod:
      return "chmod";
    case EnvOp::kLstat:
      return "lstat";
    case EnvOp::kFstat:
      return "fstat";
    case EnvOp::kUnlink:
      return "unlink";
    case EnvOp::kListDir:
      return "listdir";
    case EnvOp::kLock:
      return "lock";
    case EnvOp::kTouch:
      return "touch";
    case EnvOp::kNumOps:
      break;
  }
  return "?";
}

Env* PosixEnv() {
  static Env* const env = new PosixEnvImpl();
  return env;
}

int ErrnoOf(const absl::Status& status) {
  auto payload = status.GetPayload(kErrnoPayload);
  if (!payload.has_value()) return 0;
  int err = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &err)) return 0;
  return err;
}

std::string ErrorText(const absl::Status& status) { return std::string(status.message()); }

absl::Status ErrnoStatus(int err, std::string_view call, std::string_view path) {
  absl::Status status = absl::ErrnoToStatus(err, std::string(call) + " " + std::string(path));
  status.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(err)));
  return status;
}

}  // namespace fusejit::cache
