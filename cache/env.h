// cache/env.h: the file-system and process-environment calls the kernel cache makes, behind one
// small interface, so that tests can make any of them fail (cache/testing_env.h).
//
// Every failing call returns a status whose message names the call and the path and which carries
// the errno (ErrnoOf()). Nothing here retries or interprets errors; the cache decides.
#ifndef FUSEJIT_CACHE_ENV_H_
#define FUSEJIT_CACHE_ENV_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit::cache {

// The kinds of call, for counting and fault injection.
enum class EnvOp : int {
  kOpen,
  kRead,
  kWrite,
  kFsync,
  kClose,
  kRename,
  kMkdir,
  kChmod,
  kLstat,
  kFstat,
  kUnlink,
  kListDir,
  kLock,
  kTouch,
  kNumOps,
};
inline constexpr int kNumEnvOps = static_cast<int>(EnvOp::kNumOps);
std::string_view EnvOpName(EnvOp op);

struct FileInfo {
  enum class Type { kRegular, kDirectory, kSymlink, kOther };
  Type type = Type::kOther;
  uint32_t mode = 0;  // permission bits only (st_mode & 07777)
  uint32_t uid = 0;
  uint64_t size = 0;
  uint64_t dev = 0;
  uint64_t ino = 0;
  int64_t mtime_ns = 0;
  int64_t atime_ns = 0;
};

// Thread-safe implementations only: the cache calls an Env from many threads at once.
class Env {
 public:
  virtual ~Env() = default;

  // open(2) with O_CLOEXEC added. Returns the descriptor.
  virtual absl::StatusOr<int> Open(const std::string& path, int flags, uint32_t mode) = 0;
  // One read(2): may return fewer bytes than asked; 0 at end of file.
  virtual absl::StatusOr<size_t> Read(int fd, char* buf, size_t n) = 0;
  // One write(2): may write fewer bytes than asked.
  virtual absl::StatusOr<size_t> Write(int fd, const char* buf, size_t n) = 0;
  virtual absl::Status Fsync(int fd) = 0;
  virtual absl::Status Close(int fd) = 0;
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  virtual absl::Status Mkdir(const std::string& path, uint32_t mode) = 0;
  virtual absl::Status Chmod(const std::string& path, uint32_t mode) = 0;
  // lstat(2): never follows a symbolic link.
  virtual absl::StatusOr<FileInfo> Lstat(const std::string& path) = 0;
  virtual absl::StatusOr<FileInfo> Fstat(int fd) = 0;
  virtual absl::Status Unlink(const std::string& path) = 0;
  // Names in the directory, without "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  // flock(fd, LOCK_EX | LOCK_NB). Fails with errno EWOULDBLOCK while another open file
  // description holds the lock. Closing fd releases it.
  virtual absl::Status TryLock(int fd) = 0;
  // Sets the modification time of path (not following links) to now.
  virtual absl::Status TouchMtime(const std::string& path) = 0;

  // Not file-system calls, never fault-injected by kind:
  virtual uint32_t EffectiveUid() = 0;
  virtual std::optional<std::string> GetVar(const char* name) = 0;  // getenv(3)
};

// The real file system and environment. Process-wide, never destroyed.
Env* PosixEnv();

// The errno carried by a status returned from an Env call; 0 when it carries none.
int ErrnoOf(const absl::Status& status);
// A status for a failed call: "<call> <path>: <strerror>", carrying err for ErrnoOf().
absl::Status ErrnoStatus(int err, std::string_view call, std::string_view path);
// status.message() as a std::string (absl::string_view is not std::string_view in every absl).
std::string ErrorText(const absl::Status& status);

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_ENV_H_
