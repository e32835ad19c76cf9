// cache/testing.h: helpers for the cache tests and the worker program (target
// fusejit_cache_testing; not part of fusejit_cache).
#ifndef FUSEJIT_CACHE_TESTING_H_
#define FUSEJIT_CACHE_TESTING_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <sys/types.h>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/cache_key.h"
#include "cache/env.h"

namespace fusejit::cache::testing {

// A key and a payload per seed, the same in every process.
CacheKey TestKey(int seed);
std::string TestPayload(int seed, size_t bytes);

// A fresh directory under $TMPDIR (else /tmp), mode 0700, deleted with its contents.
// in_memory: under /dev/shm when there is one (fsync is free there: for tests that publish
// hundreds of entries and check contents, not durability).
class TempDir {
 public:
  explicit TempDir(bool in_memory = false);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

// Small file helpers for tests; they abort the test process on I/O errors they cannot report.
std::vector<std::string> ListNames(const std::string& dir);  // sorted; empty if no dir
std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, std::string_view bytes, uint32_t mode = 0600);

// Collects warnings: pass Sink() as CacheOptions::warn.
class WarningLog {
 public:
  std::function<void(std::string_view)> Sink();
  std::vector<std::string> Lines() const;
  // Lines containing text.
  int Count(std::string_view text) const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// Wraps an Env and makes chosen calls fail. Thread-safe.
class FaultInjectionEnv : public Env {
 public:
  explicit FaultInjectionEnv(Env* base = PosixEnv()) : base_(base) {}

  // The nth call of op (1-based, counted from now) fails with err; the others succeed.
  void FailNth(EnvOp op, int64_t n, int err);
  // Every call of op fails with err.
  void FailAlways(EnvOp op, int err);
  // Every call that would change the file system fails with err (EROFS: a read-only mount):
  // opens for writing or creating, write, rename, mkdir, chmod, unlink, touch.
  void FailModifications(int err);
  void Reset();  // no more faults; counts stay

  int64_t Calls(EnvOp op) const;
  int64_t InjectedFailures() const;

  // Environment variables as GetVar sees them: a value, or unset (nullopt); others pass through.
  void SetVar(const std::string& name, std::optional<std::string> value);

  absl::StatusOr<int> Open(const std::string& path, int flags, uint32_t mode) override;
  absl::StatusOr<size_t> Read(int fd, char* buf, size_t n) override;
  absl::StatusOr<size_t> Write(int fd, const char* buf, size_t n) override;
  absl::Status Fsync(int fd) override;
  absl::Status Close(int fd) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Mkdir(const std::string& path, uint32_t mode) override;
  absl::Status Chmod(const std::string& path, uint32_t mode) override;
  absl::StatusOr<FileInfo> Lstat(const std::string& path) override;
  absl::StatusOr<FileInfo> Fstat(int fd) override;
  absl::Status Unlink(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::Status TryLock(int fd) override;
  absl::Status TouchMtime(const std::string& path) override;
  uint32_t EffectiveUid() override { return base_->EffectiveUid(); }
  std::optional<std::string> GetVar(const char* name) override;

 private:
  // Counts the call; returns the errno to fail it with, or 0.
  int Inject(EnvOp op, bool modifies);

  Env* const base_;
  mutable absl::Mutex mu_;
  std::array<int64_t, kNumEnvOps> calls_ ABSL_GUARDED_BY(mu_) = {};
  std::array<int64_t, kNumEnvOps> fail_at_ ABSL_GUARDED_BY(mu_) = {};  // call number, 0: none
  std::array<int, kNumEnvOps> fail_err_ ABSL_GUARDED_BY(mu_) = {};
  std::array<int, kNumEnvOps> always_err_ ABSL_GUARDED_BY(mu_) = {};
  int modify_err_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::optional<std::string>> vars_ ABSL_GUARDED_BY(mu_);
};

// Wraps an Env, sleeping before every call and writing at most max_write bytes per Write, so
// that a process killed at a random time dies in the middle of a publish.
class SlowEnv : public Env {
 public:
  SlowEnv(Env* base, absl::Duration delay, size_t max_write)
      : base_(base), delay_(delay), max_write_(max_write) {}
  absl::StatusOr<int> Open(const std::string& p, int f, uint32_t m) override;
  absl::StatusOr<size_t> Read(int fd, char* buf, size_t n) override;
  absl::StatusOr<size_t> Write(int fd, const char* buf, size_t n) override;
  absl::Status Fsync(int fd) override;
  absl::Status Close(int fd) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Mkdir(const std::string& path, uint32_t mode) override;
  absl::Status Chmod(const std::string& path, uint32_t mode) override;
  absl::StatusOr<FileInfo> Lstat(const std::string& path) override;
  absl::StatusOr<FileInfo> Fstat(int fd) override;
  absl::Status Unlink(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::Status TryLock(int fd) override;
  absl::Status TouchMtime(const std::string& path) override;
  uint32_t EffectiveUid() override { return base_->EffectiveUid(); }
  std::optional<std::string> GetVar(const char* name) override { return base_->GetVar(name); }

 private:
  void Pause() const { absl::SleepFor(delay_); }
  Env* const base_;
  const absl::Duration delay_;
  const size_t max_write_;
};

// Multi-process tests: a child process with its stdout on a pipe.
struct Process {
  pid_t pid = -1;
  int out = -1;  // the child's stdout
};

struct Finished {
  bool killed = false;  // by a signal
  int exit_code = -1;
  std::string output;
  std::map<std::string, int64_t> result;  // the "result k=v ..." line
};

// fork + exec of argv[0] with argv; as_uid != 0: as that user (and group). env: NAME=VALUE
// settings added to (or replacing those of) this process's environment.
Process SpawnProcess(const std::vector<std::string>& argv, uid_t as_uid = 0,
                     const std::vector<std::string>& env = {});
// Reads the child's stdout up to the first newline.
std::string ReadLine(Process& p);
// Reads the rest of its stdout, waits for it, parses its "result k=v ..." line.
Finished FinishProcess(Process& p);

// A redis-server of a test's own: on 127.0.0.1 at a free port, in a temporary directory, without
// persistence; stopped (SIGKILL) when destroyed. extra_args go to redis-server, e.g.
// {"--maxmemory", "1mb"}; "--requirepass" X is remembered for Command().
class RedisServer {
 public:
  explicit RedisServer(std::vector<std::string> extra_args = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // The redis-server program, or "" when it is not installed.
  static std::string Program();

  // Whether it runs and answers; error() says why not.
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  std::string url() const;  // "redis://127.0.0.1:PORT"

  void Kill();   // SIGKILL, and wait for it
  bool Start();  // again, on the same port (after Kill); false: error() says why

  // One command on a fresh connection (AUTH first when the server has a password). The reply:
  // a string's bytes, "(nil)", an integer in decimal, a status's text, "(error) TEXT", or an
  // array's elements one per line; "(failed) WHY" when there was no reply.
  std::string Command(const std::vector<std::string>& args) const;

 private:
  TempDir dir_;
  std::vector<std::string> extra_args_;
  std::string password_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string error_;
};

}  // namespace fusejit::cache::testing

#endif  // FUSEJIT_CACHE_TESTING_H_
