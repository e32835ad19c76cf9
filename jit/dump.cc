#include "jit/dump.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <vector>

#include "fmt/format.h"

namespace fusejit::jit {
namespace {

absl::Status ErrnoError(int err, std::string_view what) {
  return absl::ErrnoToStatus(err, fmt::format("{}: {}", what, std::strerror(err)));
}

std::string TempRoot() {
  const char* tmp = std::getenv("TMPDIR");
  std::string root = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root;
}

// Whether `path` (lstat) is a folder of this user's that no one else can write: a directory, not
// a link, owned by us, not group/other-writable. `why` says what is wrong otherwise.
bool IsPrivateEnough(const std::string& path, const struct stat& st, std::string* why) {
  if (S_ISLNK(st.st_mode)) {
    *why = fmt::format("{} is a symbolic link; give the folder itself", path);
  } else if (!S_ISDIR(st.st_mode)) {
    *why = fmt::format("{} is not a directory", path);
  } else if (st.st_uid != ::geteuid()) {
    *why = fmt::format("{} is owned by uid {}, not by this user (uid {}); dumps are written only "
                       "to folders of your own",
                       path, st.st_uid, ::geteuid());
  } else if ((st.st_mode & 022) != 0) {
    *why = fmt::format("{} is writable by group or others (mode {:04o}); dumps are written only "
                       "to folders no one else can write (chmod go-w it, or choose another)",
                       path, st.st_mode & 07777);
  } else {
    return true;
  }
  return false;
}

// Deletes this user's private dump folders `prefix`* in `root` beyond the newest kKeepDumps.
void PruneOldDumps(const std::string& root, const std::string& prefix) {
  namespace fs = std::filesystem;
  struct Found {
    std::string path;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() != prefix.size() + 6) continue;
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      continue;  // not one of ours: never touched
    }
    found.push_back({it->path().string(),
                     int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec});
  }
  if (found.size() <= kKeepDumps) return;
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime_ns > b.mtime_ns; });
  for (size_t i = kKeepDumps; i < found.size(); ++i) {
    // The folder is 0700 and ours: no other user can have put anything in it. remove_all does
    // not follow symbolic links inside it.
    fs::remove_all(found[i].path, ec);
  }
}

}  // namespace

absl::StatusOr<std::string> NewPrivateDumpDir(std::string_view kind) {
  const std::string root = TempRoot();
  const std::string prefix = fmt::format("fusejit-{}.", kind);
  std::string path = fmt::format("{}/{}XXXXXX", root, prefix);
  if (::mkdtemp(path.data()) == nullptr) {
    return ErrnoError(errno, fmt::format("cannot create a private folder {} for the {} dump",
                                         path, kind));
  }
  PruneOldDumps(root, prefix);
  return path;
}

absl::Status PrepareDumpDir(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("the dump folder name is empty");
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoError(errno, fmt::format("cannot examine dump folder {}", dir));
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) {
      return absl::ErrnoToStatus(ec.value(), fmt::format("cannot create the parents of dump folder "
                                                         "{}: {}",
                                                         dir, ec.message()));
    }
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoError(errno, fmt::format("cannot create dump folder {}", dir));
    }
    if (::lstat(dir.c_str(), &st) != 0) {
      return ErrnoError(errno, fmt::format("cannot examine dump folder {}", dir));
    }
  }
  std::string why;
  if (!IsPrivateEnough(dir, st, &why)) {
    return absl::FailedPreconditionError(fmt::format("refusing dump folder: {}", why));
  }
  return absl::OkStatus();
}

absl::Status WriteDumpFile(const std::string& dir, const std::string& name,
                           std::string_view text) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(fmt::format("dump file name '{}' is not a plain name", name));
  }
  static std::atomic<uint64_t> serial{0};
  const std::string path = fmt::format("{}/{}", dir, name);
  const std::string tmp =
      fmt::format("{}/.{}.tmp.{}.{}", dir, name, ::getpid(), serial.fetch_add(1));
  int fd;
  do {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, fmt::format("cannot create {}", tmp));
  std::string error;
  for (size_t done = 0; done < text.size() && error.empty();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = fmt::format("cannot write {}: {}", tmp, std::strerror(n < 0 ? errno : EIO));
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (::close(fd) != 0 && error.empty()) {
    error = fmt::format("cannot close {}: {}", tmp, std::strerror(errno));
  }
  if (error.empty() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    error = fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
  }
  if (!error.empty()) {
    ::unlink(tmp.c_str());
    return absl::InternalError(error);
  }
  return absl::OkStatus();
}

}  // namespace fusejit::jit
