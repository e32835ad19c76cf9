#include "cache/redis_store.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "absl/strings/numbers.h"
#include "cache/entry_format.h"
#include "cache/env.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

// Deletes the lock only while it holds the caller's token (owner-only release).
constexpr char kUnlockScript[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
    "else return 0 end";

timeval DurationToTimeval(absl::Duration d) {
  const int64_t us = std::max<int64_t>(absl::ToInt64Microseconds(d), 1000);
  timeval tv;
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  return tv;
}

// Blocks SIGPIPE on this thread while it lives; consumes a SIGPIPE raised meanwhile (by a write
// to a server that went away) unless one was already pending before.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~SigpipeGuard() {
    if (!blocked_) return;
    sigset_t pending;
    sigemptyset(&pending);
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      (void)sigtimedwait(&pipe_, nullptr, &zero);  // nothing to do if it is gone already
    }
    (void)pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // cannot fail with a valid set
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
  bool blocked_ = false;
};

std::string HostPid() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device rd;
  return fmt::format("{}:{}:{:08x}{:08x}", host, ::getpid(), rd(), rd());
}

// Redis glob-escapes for a MATCH pattern.
std::string GlobEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string_view ReplyText(const redisReply* r) {
  return r->str == nullptr ? std::string_view() : std::string_view(r->str, r->len);
}

// One command, binary-safe, with SIGPIPE blocked (a Redis gone mid-write must not kill the
// process). hiredis's reply (nullptr on an I/O error: ctx->errstr says why).
void* CommandArgv(redisContext* ctx, const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  SigpipeGuard guard;
  return redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
}

}  // namespace

void RedisStore::ReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }

RedisStore::RedisStore(RemoteOptions options, WarnFn warn)
    : options_(std::move(options)), warn_(std::move(warn)), token_base_(HostPid()) {}

RedisStore::~RedisStore() {
  absl::MutexLock lock(&mu_);
  if (ctx_ != nullptr) redisFree(ctx_);
}

std::string RedisStore::Describe() const { return options_.address.Display(); }

int64_t RedisStore::trips() const {
  absl::MutexLock lock(&mu_);
  return trips_;
}

void RedisStore::Warn(std::string_view reason, std::string_view message) {
  {
    absl::MutexLock lock(&warn_mu_);
    for (const std::string& r : warned_) {
      if (r == reason) return;
    }
    warned_.emplace_back(reason);
  }
  if (warn_) {
    warn_(reason, message);
  } else {
    fmt::print(stderr, "fusejit cache: {}\n", message);
    std::fflush(stderr);
  }
}

absl::Status RedisStore::TripLocked(absl::Status status) {
  if (ctx_ != nullptr) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  ++trips_;
  retry_at_ = absl::Now() + options_.retry_interval;
  Warn("remote-down",
       fmt::format("remote cache {}: {}; kernels are compiled and cached locally meanwhile "
                   "(retrying every {} s)",
                   Describe(), ErrorText(status),
                   absl::ToDoubleSeconds(options_.retry_interval)));
  return status;
}

void RedisStore::DisableLocked(const absl::Status& status) {
  if (ctx_ != nullptr) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  disabled_ = status;
  Warn("remote-auth", fmt::format("remote cache {}: {}; check the user and password in "
                                  "FUSEJIT_REMOTE_CACHE; only the local cache is used",
                                  Describe(), ErrorText(status)));
}

absl::Status RedisStore::ConnectLocked() {
  const timeval connect_tv = DurationToTimeval(options_.connect_timeout);
  const RedisAddress& a = options_.address;
  redisContext* c = a.unix_path.empty()
                        ? redisConnectWithTimeout(a.host.c_str(), a.port, connect_tv)
                        : redisConnectUnixWithTimeout(a.unix_path.c_str(), connect_tv);
  if (c == nullptr) {
    return TripLocked(absl::ResourceExhaustedError("cannot allocate a connection"));
  }
  if (c->err != 0) {
    const std::string why = c->errstr;
    redisFree(c);
    return TripLocked(absl::UnavailableError(fmt::format(
        "cannot connect ({}; connect timeout {} ms)", why,
        absl::ToInt64Milliseconds(options_.connect_timeout))));
  }
  if (redisSetTimeout(c, DurationToTimeval(options_.timeout)) != REDIS_OK) {
    const std::string why = c->errstr;
    redisFree(c);
    return TripLocked(absl::UnavailableError(fmt::format("cannot set the timeout: {}", why)));
  }
  ctx_ = c;
  auto run = [&](std::vector<std::string_view> args) -> absl::StatusOr<Reply> {
    void* raw = CommandArgv(ctx_, args);
    if (raw == nullptr) {
      return TripLocked(absl::UnavailableError(
          fmt::format("{} failed: {}", args[0], ctx_->errstr)));
    }
    return Reply(static_cast<redisReply*>(raw));
  };
  if (!a.password.empty()) {
    std::vector<std::string_view> args = {"AUTH"};
    if (!a.user.empty()) args.push_back(a.user);
    args.push_back(a.password);
    absl::StatusOr<Reply> r = run(args);
    if (!r.ok()) return r.status();
    if ((*r)->type == REDIS_REPLY_ERROR) {
      absl::Status s = absl::PermissionDeniedError(
          fmt::format("authentication refused ({})", ReplyText(r->get())));
      DisableLocked(s);
      return s;
    }
  }
  if (a.db != 0) {
    const std::string db = std::to_string(a.db);
    absl::StatusOr<Reply> r = run({"SELECT", db});
    if (!r.ok()) return r.status();
    if ((*r)->type == REDIS_REPLY_ERROR) {
      absl::Status s = absl::FailedPreconditionError(
          fmt::format("SELECT {} refused ({})", a.db, ReplyText(r->get())));
      const bool auth = ReplyText(r->get()).substr(0, 6) == "NOAUTH";
      if (auth) s = absl::PermissionDeniedError(fmt::format("authentication needed ({})",
                                                            ReplyText(r->get())));
      DisableLocked(s);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RedisStore::Reply> RedisStore::Command(const std::vector<std::string_view>& args) {
  absl::MutexLock lock(&mu_);
  if (!disabled_.ok()) return disabled_;
  if (ctx_ == nullptr) {
    const absl::Time now = absl::Now();
    if (now < retry_at_) {
      return absl::UnavailableError(fmt::format(
          "remote cache {} skipped for {:.1f} s more after a failure", Describe(),
          absl::ToDoubleSeconds(retry_at_ - now)));
    }
    if (absl::Status s = ConnectLocked(); !s.ok()) return s;
  }
  void* raw = CommandArgv(ctx_, args);
  if (raw == nullptr) {
    const std::string why = ctx_->errstr;
    return TripLocked(absl::UnavailableError(fmt::format(
        "{} failed: {} (timeout {} ms)", args[0], why.empty() ? "no reply" : why,
        absl::ToInt64Milliseconds(options_.timeout))));
  }
  return Reply(static_cast<redisReply*>(raw));
}

absl::Status RedisStore::ReplyError(const redisReply* reply, std::string_view command) {
  if (reply->type != REDIS_REPLY_ERROR) return absl::OkStatus();
  const std::string_view text = ReplyText(reply);
  if (text.substr(0, 6) == "NOAUTH" || text.substr(0, 9) == "WRONGPASS") {
    absl::Status s = absl::PermissionDeniedError(fmt::format("authentication refused ({})", text));
    absl::MutexLock lock(&mu_);
    DisableLocked(s);
    return s;
  }
  if (text.substr(0, 3) == "OOM") {
    Warn("remote-full", fmt::format("remote cache {} is full ({}): new kernels are not published "
                                    "there (raise maxmemory or set an eviction policy such as "
                                    "allkeys-lru)",
                                    Describe(), text));
    return absl::ResourceExhaustedError(fmt::format("{}: {}", command, text));
  }
  return absl::InternalError(fmt::format("{}: {}", command, text));
}

absl::StatusOr<std::optional<std::string>> RedisStore::Get(std::string_view name) {
  const std::string key = Key(name);
  absl::StatusOr<Reply> r = Command({"GET", key});
  if (!r.ok()) return r.status();
  if (absl::Status s = ReplyError(r->get(), "GET"); !s.ok()) return s;
  if ((*r)->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if ((*r)->type != REDIS_REPLY_STRING) {
    return absl::InternalError(fmt::format("GET {}: unexpected reply type {}", key, (*r)->type));
  }
  return std::optional<std::string>(std::string(ReplyText(r->get())));
}

absl::StatusOr<bool> RedisStore::Put(std::string_view name, std::string_view bytes,
                                     PutMode mode) {
  const std::string key = Key(name);
  std::vector<std::string_view> args = {"SET", key, bytes};
  if (mode == PutMode::kIfAbsent) args.push_back("NX");
  absl::StatusOr<Reply> r = Command(args);
  if (!r.ok()) return r.status();
  if (absl::Status s = ReplyError(r->get(), "SET"); !s.ok()) return s;
  if ((*r)->type == REDIS_REPLY_NIL) return false;
  if ((*r)->type == REDIS_REPLY_STATUS && ReplyText(r->get()) == "OK") return true;
  return absl::InternalError(fmt::format("SET {}: unexpected reply", key));
}

absl::StatusOr<std::optional<std::string>> RedisStore::TryLock(std::string_view name,
                                                               absl::Duration ttl) {
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = fmt::format("{}:{}", token_base_, ++serial_);
  }
  const std::string key = LockKey(name);
  const std::string ms = std::to_string(std::max<int64_t>(absl::ToInt64Milliseconds(ttl), 1));
  absl::StatusOr<Reply> r = Command({"SET", key, token, "NX", "PX", ms});
  if (!r.ok()) return r.status();
  if (absl::Status s = ReplyError(r->get(), "SET NX"); !s.ok()) return s;
  if ((*r)->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if ((*r)->type == REDIS_REPLY_STATUS && ReplyText(r->get()) == "OK") {
    return std::optional<std::string>(std::move(token));
  }
  return absl::InternalError(fmt::format("SET {} NX: unexpected reply", key));
}

absl::Status RedisStore::Unlock(std::string_view name, std::string_view token) {
  const std::string key = LockKey(name);
  absl::StatusOr<Reply> r = Command({"EVAL", kUnlockScript, "1", key, token});
  if (!r.ok()) return r.status();
  return ReplyError(r->get(), "EVAL (unlock)");
}

absl::StatusOr<std::vector<std::string>> RedisStore::List() {
  std::vector<std::string> names;
  const std::string pattern = GlobEscape(options_.prefix) + "*";
  std::string cursor = "0";
  do {
    absl::StatusOr<Reply> r = Command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    if (!r.ok()) return r.status();
    if (absl::Status s = ReplyError(r->get(), "SCAN"); !s.ok()) return s;
    const redisReply* reply = r->get();
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_ARRAY) {
      return absl::InternalError("SCAN: unexpected reply");
    }
    cursor = std::string(ReplyText(reply->element[0]));
    const redisReply* keys = reply->element[1];
    for (size_t i = 0; i < keys->elements; ++i) {
      if (keys->element[i]->type != REDIS_REPLY_STRING) continue;
      std::string_view key = ReplyText(keys->element[i]);
      if (key.substr(0, options_.prefix.size()) != options_.prefix) continue;
      key.remove_prefix(options_.prefix.size());
      if (IsEntryFileName(key)) names.emplace_back(key);
    }
  } while (cursor != "0");
  return names;
}

absl::Status RedisStore::Remove(std::string_view name) {
  const std::string key = Key(name);
  absl::StatusOr<Reply> r = Command({"DEL", key});
  if (!r.ok()) return r.status();
  return ReplyError(r->get(), "DEL");
}

absl::StatusOr<StoreUsage> RedisStore::Usage() {
  absl::StatusOr<std::vector<std::string>> names = List();
  if (!names.ok()) return names.status();
  StoreUsage usage;
  for (const std::string& name : *names) {
    const std::string key = Key(name);
    absl::StatusOr<Reply> r = Command({"STRLEN", key});
    if (!r.ok()) return r.status();
    if (absl::Status s = ReplyError(r->get(), "STRLEN"); !s.ok()) return s;
    if ((*r)->type != REDIS_REPLY_INTEGER || (*r)->integer == 0) continue;  // gone meanwhile
    ++usage.entries;
    usage.entry_bytes += static_cast<uint64_t>((*r)->integer);
  }
  return usage;
}

absl::Status RedisStore::Ping() {
  absl::StatusOr<Reply> r = Command({"PING"});
  if (!r.ok()) return r.status();
  return ReplyError(r->get(), "PING");
}

void RedisStore::Count(std::string_view counter) {
  const std::string key = options_.prefix + "stats";
  // Best effort: a failure is the breaker's business; a lost count changes nothing else.
  absl::StatusOr<Reply> r = Command({"HINCRBY", key, counter, "1"});
  if (r.ok()) (void)ReplyError(r->get(), "HINCRBY");
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> RedisStore::Counters() {
  const std::string key = options_.prefix + "stats";
  absl::StatusOr<Reply> r = Command({"HGETALL", key});
  if (!r.ok()) return r.status();
  if (absl::Status s = ReplyError(r->get(), "HGETALL"); !s.ok()) return s;
  const redisReply* reply = r->get();
  if (reply->type != REDIS_REPLY_ARRAY) return absl::InternalError("HGETALL: unexpected reply");
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t i = 0; i + 1 < reply->elements; i += 2) {
    int64_t v = 0;
    if (reply->element[i]->type != REDIS_REPLY_STRING ||
        reply->element[i + 1]->type != REDIS_REPLY_STRING ||
        !absl::SimpleAtoi(
            absl::string_view(reply->element[i + 1]->str, reply->element[i + 1]->len), &v)) {
      continue;
    }
    out.emplace_back(std::string(ReplyText(reply->element[i])), v);
  }
  return out;
}

}  // namespace fusejit::cache
