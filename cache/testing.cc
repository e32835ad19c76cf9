#include "cache/testing.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "fmt/format.h"

extern char** environ;

namespace fusejit::cache::testing {

CacheKey TestKey(int seed) {
  CacheKey key;
  key.source_hash = HashSource(fmt::format("extern \"C\" __global__ void k{}() {{}}\n", seed));
  key.generator_version = "fusejit-test 1";
  key.nvrtc_version = "13.0";
  key.options = "--gpu-architecture=sm_90 -default-device --std=c++17";
  key.arch = "sm_90";
  key.spec = fmt::format("x:f32[{}] | relu", seed);
  return key;
}

std::string TestPayload(int seed, size_t bytes) {
  std::string out(bytes, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(seed + 1);
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;  // LCG: test data, not a hash
    out[i] = static_cast<char>(x >> 56);
  }
  return out;
}

TempDir::TempDir(bool in_memory) {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  if (in_memory && ::access("/dev/shm", W_OK | X_OK) == 0) base = "/dev/shm";
  std::string pattern = base + "/fusejit_cache_test.XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests make read-only directories; give write permission back so that all can be deleted.
  for (auto it = std::filesystem::recursive_directory_iterator(
           path_, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) ::chmod(it->path().c_str(), 0700);
  }
  ::chmod(path_.c_str(), 0700);
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::abort();
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFileOrDie(const std::string& path, std::string_view bytes, uint32_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()) ||
      ::fchmod(fd, mode) != 0 || ::close(fd) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

std::function<void(std::string_view)> WarningLog::Sink() {
  return [this](std::string_view line) {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(line);
  };
}

std::vector<std::string> WarningLog::Lines() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

int WarningLog::Count(std::string_view text) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const std::string& line : lines_) n += line.find(text) != std::string::npos ? 1 : 0;
  return n;
}

void FaultInjectionEnv::FailNth(EnvOp op, int64_t n, int err) {
  absl::MutexLock lock(&mu_);
  const int i = static_cast<int>(op);
  fail_at_[i] = calls_[i] + n;
  fail_err_[i] = err;
}

void FaultInjectionEnv::FailAlways(EnvOp op, int err) {
  absl::MutexLock lock(&mu_);
  always_err_[static_cast<int>(op)] = err;
}

void FaultInjectionEnv::FailModifications(int err) {
  absl::MutexLock lock(&mu_);
  modify_err_ = err;
}

void FaultInjectionEnv::Reset() {
  absl::MutexLock lock(&mu_);
  fail_at_.fill(0);
  fail_err_.fill(0);
  always_err_.fill(0);
  modify_err_ = 0;
}

int64_t FaultInjectionEnv::Calls(EnvOp op) const {
  absl::MutexLock lock(&mu_);
  return calls_[static_cast<int>(op)];
}

int64_t FaultInjectionEnv::InjectedFailures() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

void FaultInjectionEnv::SetVar(const std::string& name, std::optional<std::string> value) {
  absl::MutexLock lock(&mu_);
  vars_[name] = std::move(value);
}

std::optional<std::string> FaultInjectionEnv::GetVar(const char* name) {
  {
    absl::MutexLock lock(&mu_);
    auto it = vars_.find(name);
    if (it != vars_.end()) return it->second;
  }
  return base_->GetVar(name);
}

int FaultInjectionEnv::Inject(EnvOp op, bool modifies) {
  absl::MutexLock lock(&mu_);
  const int i = static_cast<int>(op);
  const int64_t call = ++calls_[i];
  int err = 0;
  if (fail_at_[i] == call) {
    err = fail_err_[i];
  } else if (always_err_[i] != 0) {
    err = always_err_[i];
  } else if (modifies && modify_err_ != 0) {
    err = modify_err_;
  }
  if (err != 0) ++injected_;
  return err;
}

#define FJ_INJECT(op, modifies, what)                                        \
  if (int err = Inject(op, modifies); err != 0) {                            \
    return ErrnoStatus(err, "injected " + std::string(EnvOpName(op)), what); \
  }

absl::StatusOr<int> FaultInjectionEnv::Open(const std::string& path, int flags, uint32_t mode) {
  const bool modifies = (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) != 0;
  FJ_INJECT(EnvOp::kOpen, modifies, path);
  return base_->Open(path, flags, mode);
}
absl::StatusOr<size_t> FaultInjectionEnv::Read(int fd, char* buf, size_t n) {
  FJ_INJECT(EnvOp::kRead, false, "fd");
  return base_->Read(fd, buf, n);
}
absl::StatusOr<size_t> FaultInjectionEnv::Write(int fd, const char* buf, size_t n) {
  FJ_INJECT(EnvOp::kWrite, true, "fd");
  return base_->Write(fd, buf, n);
}
absl::Status FaultInjectionEnv::Fsync(int fd) {
  FJ_INJECT(EnvOp::kFsync, false, "fd");
  return base_->Fsync(fd);
}
absl::Status FaultInjectionEnv::Close(int fd) {
  if (int err = Inject(EnvOp::kClose, false); err != 0) {
    (void)base_->Close(fd);  // like Linux: the descriptor is gone even when close fails
    return ErrnoStatus(err, "injected close", "fd");
  }
  return base_->Close(fd);
}
absl::Status FaultInjectionEnv::Rename(const std::string& from, const std::string& to) {
  FJ_INJECT(EnvOp::kRename, true, from);
  return base_->Rename(from, to);
}
absl::Status FaultInjectionEnv::Mkdir(const std::string& path, uint32_t mode) {
  FJ_INJECT(EnvOp::kMkdir, true, path);
  return base_->Mkdir(path, mode);
}
absl::Status FaultInjectionEnv::Chmod(const std::string& path, uint32_t mode) {
  FJ_INJECT(EnvOp::kChmod, true, path);
  return base_->Chmod(path, mode);
}
absl::StatusOr<FileInfo> FaultInjectionEnv::Lstat(const std::string& path) {
  FJ_INJECT(EnvOp::kLstat, false, path);
  return base_->Lstat(path);
}
absl::StatusOr<FileInfo> FaultInjectionEnv::Fstat(int fd) {
  FJ_INJECT(EnvOp::kFstat, false, "fd");
  return base_->Fstat(fd);
}
absl::Status FaultInjectionEnv::Unlink(const std::string& path) {
  FJ_INJECT(EnvOp::kUnlink, true, path);
  return base_->Unlink(path);
}
absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::ListDir(const std::string& path) {
  FJ_INJECT(EnvOp::kListDir, false, path);
  return base_->ListDir(path);
}
absl::Status FaultInjectionEnv::TryLock(int fd) {
  FJ_INJECT(EnvOp::kLock, false, "fd");
  return base_->TryLock(fd);
}
absl::Status FaultInjectionEnv::TouchMtime(const std::string& path) {
  FJ_INJECT(EnvOp::kTouch, true, path);
  return base_->TouchMtime(path);
}
#undef FJ_INJECT

absl::StatusOr<int> SlowEnv::Open(const std::string& p, int f, uint32_t m) {
  Pause();
  return base_->Open(p, f, m);
}
absl::StatusOr<size_t> SlowEnv::Read(int fd, char* buf, size_t n) {
  Pause();
  return base_->Read(fd, buf, n);
}
absl::StatusOr<size_t> SlowEnv::Write(int fd, const char* buf, size_t n) {
  Pause();
  return base_->Write(fd, buf, std::min(n, max_write_));
}
absl::Status SlowEnv::Fsync(int fd) {
  Pause();
  return base_->Fsync(fd);
}
absl::Status SlowEnv::Close(int fd) {
  Pause();
  return base_->Close(fd);
}
absl::Status SlowEnv::Rename(const std::string& from, const std::string& to) {
  Pause();
  return base_->Rename(from, to);
}
absl::Status SlowEnv::Mkdir(const std::string& path, uint32_t mode) {
  Pause();
  return base_->Mkdir(path, mode);
}
absl::Status SlowEnv::Chmod(const std::string& path, uint32_t mode) {
  Pause();
  return base_->Chmod(path, mode);
}
absl::StatusOr<FileInfo> SlowEnv::Lstat(const std::string& path) {
  Pause();
  return base_->Lstat(path);
}
absl::StatusOr<FileInfo> SlowEnv::Fstat(int fd) {
  Pause();
  return base_->Fstat(fd);
}
absl::Status SlowEnv::Unlink(const std::string& path) {
  Pause();
  return base_->Unlink(path);
}
absl::StatusOr<std::vector<std::string>> SlowEnv::ListDir(const std::string& path) {
  Pause();
  return base_->ListDir(path);
}
absl::Status SlowEnv::TryLock(int fd) {
  Pause();
  return base_->TryLock(fd);
}
absl::Status SlowEnv::TouchMtime(const std::string& path) {
  Pause();
  return base_->TouchMtime(path);
}

}  // namespace fusejit::cache::testing

// ---- processes and redis-server ----

namespace fusejit::cache::testing {

Process SpawnProcess(const std::vector<std::string>& args, uid_t as_uid,
                     const std::vector<std::string>& env) {
  std::vector<std::string> argv_s = args;
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child's environment, built before fork (setenv is not async-signal-safe).
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& o : env) replaced |= o.substr(0, o.find('=')) == name;
    if (!replaced) env_s.emplace_back(entry);
  }
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::dup2(fds[1], 1);
    if (as_uid != 0 &&
        (::setgroups(0, nullptr) != 0 || ::setgid(as_uid) != 0 || ::setuid(as_uid) != 0)) {
      ::_exit(126);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return {};
  }
  return {pid, fds[0]};
}

std::string ReadLine(Process& p) {
  std::string line;
  char c;
  while (::read(p.out, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

Finished FinishProcess(Process& p) {
  Finished f;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p.out, buf, sizeof(buf))) > 0) f.output.append(buf, static_cast<size_t>(n));
  ::close(p.out);
  int status = 0;
  ::waitpid(p.pid, &status, 0);
  f.killed = WIFSIGNALED(status);
  f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  for (absl::string_view line : absl::StrSplit(f.output, '\n')) {
    if (!absl::ConsumePrefix(&line, "result ")) continue;
    for (absl::string_view kv : absl::StrSplit(line, ' ')) {
      std::pair<absl::string_view, absl::string_view> kvp = absl::StrSplit(kv, '=');
      int64_t v = 0;
      if (absl::SimpleAtoi(kvp.second, &v)) f.result[std::string(kvp.first)] = v;
    }
  }
  return f;
}

namespace {

// A port that was free a moment ago on 127.0.0.1 (the kernel picks it).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string ReplyToText(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      return std::string(r->str, r->len);
    case REDIS_REPLY_NIL:
      return "(nil)";
    case REDIS_REPLY_INTEGER:
      return std::to_string(r->integer);
    case REDIS_REPLY_ERROR:
      return "(error) " + std::string(r->str, r->len);
    case REDIS_REPLY_ARRAY: {
      std::string out;
      for (size_t i = 0; i < r->elements; ++i) {
        if (i > 0) out += "\n";
        out += ReplyToText(r->element[i]);
      }
      return out;
    }
    default:
      return "(unknown reply)";
  }
}

}  // namespace

std::string RedisServer::Program() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server",
                        "/usr/sbin/redis-server"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

RedisServer::RedisServer(std::vector<std::string> extra_args)
    : extra_args_(std::move(extra_args)) {
  for (size_t i = 0; i + 1 < extra_args_.size(); ++i) {
    if (extra_args_[i] == "--requirepass") password_ = extra_args_[i + 1];
  }
  if (Program().empty()) {
    error_ = "redis-server is not installed (scripts/install-deps.sh installs it)";
    return;
  }
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = FreePort();
    if (port_ != 0 && Start()) return;
  }
}

RedisServer::~RedisServer() { Kill(); }

std::string RedisServer::url() const { return fmt::format("redis://127.0.0.1:{}", port_); }

void RedisServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

bool RedisServer::Start() {
  Kill();
  error_.clear();
  std::vector<std::string> args = {Program(),  "--port",       std::to_string(port_),
                                   "--bind",   "127.0.0.1",    "--save",
                                   "",         "--appendonly", "no",
                                   "--dir",    dir_.path(),    "--logfile",
                                   dir_.Sub("redis.log")};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  Process p = SpawnProcess(args);
  if (p.pid <= 0) {
    error_ = "cannot start redis-server";
    return false;
  }
  ::close(p.out);
  pid_ = p.pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = fmt::format("redis-server exited at start (port {}); see its log", port_);
      return false;
    }
    const std::string pong = Command({"PING"});
    if (pong == "PONG") return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  error_ = fmt::format("redis-server on port {} does not answer PING", port_);
  Kill();
  return false;
}

std::string RedisServer::Command(const std::vector<std::string>& args) const {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
  if (c == nullptr) return "(failed) no context";
  absl::Cleanup free_context = [c] { redisFree(c); };
  if (c->err != 0) return fmt::format("(failed) {}", c->errstr);
  if (redisSetTimeout(c, tv) != REDIS_OK) return "(failed) timeout";
  auto run = [&](const std::vector<std::string>& a) -> std::string {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& s : a) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    }
    void* raw = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
    if (raw == nullptr) return fmt::format("(failed) {}", c->errstr);
    auto* reply = static_cast<redisReply*>(raw);
    std::string text = ReplyToText(reply);
    freeReplyObject(reply);
    return text;
  };
  if (!password_.empty()) {
    const std::string auth = run({"AUTH", password_});
    if (auth != "OK") return auth;
  }
  return run(args);
}

}  // namespace fusejit::cache::testing
