// cache/redis_store.h: the Store (cache/store.h) on a Redis server, through hiredis.
//
//   entries   SET <prefix><name> <entry bytes> [NX]      GET <prefix><name>
//   locks     SET <prefix>lock:<name> <token> NX PX <ttl>; released by a Lua script that deletes
//             the key only while it still holds the owner's token
//   counters  HINCRBY <prefix>stats <counter> 1           (fleet-wide, `fusejit cache stats`)
//
// One connection per store, opened on first use (connect timeout), every command under the
// operation timeout. Circuit breaker: after a failure that costs time or the connection
// (unreachable, timed out, disconnected), every call fails at once with Unavailable for
// retry_interval, then one attempt reconnects; so a dead or slow server costs at most one timeout
// per retry_interval. Authentication refused (or needed and not given) fails every later call
// with PermissionDenied: that does not fix itself. Each of these is warned about once, through
// `warn`. Error replies such as OOM (maxmemory reached) fail only that call.
//
// SIGPIPE is blocked on the calling thread around socket writes (a server killed mid-command
// must not kill the process) and a SIGPIPE raised by them is consumed.
//
// Thread-safe: calls are serialized on the one connection (none sleeps holding it).
#ifndef FUSEJIT_CACHE_REDIS_STORE_H_
#define FUSEJIT_CACHE_REDIS_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/remote_config.h"
#include "cache/store.h"

struct redisContext;
struct redisReply;

namespace fusejit::cache {

class RedisStore final : public Store {
 public:
  // warn(reason, message): called at most once per reason; nullptr: stderr.
  using WarnFn = std::function<void(std::string_view reason, std::string_view message)>;
  RedisStore(RemoteOptions options, WarnFn warn);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::string Describe() const override;
  absl::StatusOr<std::optional<std::string>> Get(std::string_view name) override;
  absl::StatusOr<bool> Put(std::string_view name, std::string_view bytes, PutMode mode) override;
  absl::StatusOr<std::optional<std::string>> TryLock(std::string_view name,
                                                     absl::Duration ttl) override;
  absl::Status Unlock(std::string_view name, std::string_view token) override;
  absl::StatusOr<std::vector<std::string>> List() override;
  absl::Status Remove(std::string_view name) override;
  absl::StatusOr<StoreUsage> Usage() override;
  absl::Status Ping() override;
  void Count(std::string_view counter) override;
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> Counters() override;

  // How many times the breaker opened (failures that cost a timeout or the connection).
  int64_t trips() const;

 private:
  struct ReplyDeleter {
    void operator()(redisReply* r) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  // Runs one command. Error replies are returned as replies (see ReplyError); a failed call,
  // an open breaker or a refused login are statuses.
  absl::StatusOr<Reply> Command(const std::vector<std::string_view>& args);
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the connection and opens the breaker; warns once. Returns status.
  absl::Status TripLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DisableLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The status for an error reply (nullptr: not an error): OOM -> ResourceExhausted (warned
  // once), NOAUTH/WRONGPASS -> PermissionDenied (and the store is disabled), others Internal.
  absl::Status ReplyError(const redisReply* reply, std::string_view command);
  void Warn(std::string_view reason, std::string_view message);
  std::string Key(std::string_view name) const { return options_.prefix + std::string(name); }
  std::string LockKey(std::string_view name) const {
    return options_.prefix + "lock:" + std::string(name);
  }

  const RemoteOptions options_;
  const WarnFn warn_;
  const std::string token_base_;  // host:pid, for lock tokens
  mutable absl::Mutex mu_;
  redisContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status disabled_ ABSL_GUARDED_BY(mu_);  // not OK: refused for good
  int64_t trips_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex warn_mu_;
  std::vector<std::string> warned_ ABSL_GUARDED_BY(warn_mu_);
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_REDIS_STORE_H_
