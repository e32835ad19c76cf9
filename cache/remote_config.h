// cache/remote_config.h: configuration of the remote cache tier (a Redis server shared by a
// fleet), from the environment:
//
//   FUSEJIT_REMOTE_CACHE                     redis://[[user]:password@]host[:port][/db]
//                                            or unix:///path/to/redis.sock; unset/empty: none
//   FUSEJIT_REMOTE_CACHE_READONLY=1          read, never publish (nor lock)
//   FUSEJIT_REMOTE_CACHE_CONNECT_TIMEOUT_MS  default 100
//   FUSEJIT_REMOTE_CACHE_TIMEOUT_MS          each command; default 500
//   FUSEJIT_REMOTE_CACHE_RETRY_MS            after a failure, no attempt for this long (the
//                                            circuit breaker); default 30000
//   FUSEJIT_REMOTE_CACHE_LOCK_TTL_MS         compile-once lock lifetime; default 120000
//   FUSEJIT_REMOTE_CACHE_MAX_VALUE_BYTES     per-value cap (bytes, or K/M/G); default 64M
//
// Malformed values are warned about on stderr, naming the variable and what is accepted, and
// ignored (a bad URL: no remote tier; local caching goes on).
#ifndef FUSEJIT_CACHE_REMOTE_CONFIG_H_
#define FUSEJIT_CACHE_REMOTE_CONFIG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/entry_format.h"

namespace fusejit::cache {

class Env;
class Store;

inline constexpr std::string_view kRemoteUrlForms =
    "redis://[[user]:password@]host[:port][/db] or unix:///path/to/redis.sock";

// Where the Redis server is and how to log in.
struct RedisAddress {
  std::string host;       // TCP (IPv6 without brackets); empty for a Unix socket
  int port = 6379;
  std::string unix_path;  // Unix socket
  std::string user;       // ACL user; empty: the default user
  std::string password;   // empty: no AUTH
  int db = 0;
  // The URL without the password, for messages.
  std::string Display() const;
};

// Parses FUSEJIT_REMOTE_CACHE's value. InvalidArgument says what is wrong (never the password).
absl::StatusOr<RedisAddress> ParseRedisUrl(std::string_view url);

struct RemoteOptions {
  RedisAddress address;
  // Keys are prefix + entry name ("fusejit:1:<32 hex>.fjk"), locks prefix + "lock:" + name,
  // fleet counters the hash prefix + "stats". The tuning database adds "tuning:".
  std::string prefix = DefaultPrefix();
  absl::Duration connect_timeout = absl::Milliseconds(100);
  absl::Duration timeout = absl::Milliseconds(500);
  absl::Duration retry_interval = absl::Seconds(30);
  absl::Duration lock_ttl = absl::Minutes(2);
  uint64_t max_value_bytes = uint64_t{64} << 20;
  bool read_only = false;
  // Tests: use this store instead of connecting to address.
  std::shared_ptr<Store> store;

  // "fusejit:<entry format version>:"
  static std::string DefaultPrefix() { return "fusejit:" + std::to_string(kFormatVersion) + ":"; }
};

// The remote tier the environment asks for; nullopt when none (or FUSEJIT_REMOTE_CACHE is
// malformed: warned about on stderr once per call).
std::optional<RemoteOptions> RemoteOptionsFromEnvironment(Env* env);

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_REMOTE_CONFIG_H_
