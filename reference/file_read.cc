#include "reference/file_read.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "fmt/format.h"

namespace fusejit {
namespace {

std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                            const std::string& what) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer; it is refused just below.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, fmt::format("cannot read {} {}: {}", what, path,
                                                std::strerror(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    return absl::InternalError(fmt::format("cannot examine {} {}: {}", what, path,
                                           std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        fmt::format("{} {} is {}; expected a regular file", what, path, KindOf(st.st_mode)));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{} {} is {} bytes; the limit for a {} is {} bytes", what, path,
        static_cast<uint64_t>(st.st_size), what, max_bytes));
  }
  // Read what fstat promised, plus one byte to notice a file that grew: never more.
  std::string data(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      return absl::InternalError(fmt::format("error reading {} {}: {}", what, path,
                                             std::strerror(err)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > static_cast<size_t>(st.st_size)) {
    return absl::InvalidArgumentError(
        fmt::format("{} {} grew while it was read; read it again when it is complete", what, path));
  }
  data.resize(got);
  return data;
}

}  // namespace fusejit
