// cache/remote_tier.h (internal): the remote tier of KernelCache: entries in a shared Store
// (Redis), in the disk cache's format and checked the same way (cache/entry_format.h).
//
// - Fetch: a value that fails any check (truncated, corrupted, another key's, over the size cap)
//   is a miss, counted in remote_rejected and warned about once per reason; the caller compiles
//   and republishes it (Publish with replace).
// - Compile once per fleet: Acquire takes the key's lock in the store (SET NX with a TTL,
//   released by its owner only), polling while another machine holds it; a waiter that outlives
//   the TTL takes the lock and compiles itself.
// - Read-only: Fetch only; no locks, publishes or counters are written.
// - Store failures are counted (remote_errors) and never reach GetOrCompile; the store's circuit
//   breaker bounds what they cost (cache/redis_store.h).
// Thread-safe.
#ifndef FUSEJIT_CACHE_REMOTE_TIER_H_
#define FUSEJIT_CACHE_REMOTE_TIER_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "cache/cache_key.h"
#include "cache/remote_config.h"
#include "cache/store.h"

namespace fusejit::cache {

struct Counters;
class Warnings;

class RemoteTier {
 public:
  // A held (or not) compile lock; released by its destructor or Release().
  class Lock {
   public:
    Lock() = default;
    Lock(RemoteTier* tier, std::string name, std::string token)
        : tier_(tier), name_(std::move(name)), token_(std::move(token)) {}
    Lock(Lock&& o) noexcept { *this = std::move(o); }
    Lock& operator=(Lock&& o) noexcept;
    ~Lock() { Release(); }
    bool held() const { return tier_ != nullptr; }
    void Release();

   private:
    RemoteTier* tier_ = nullptr;
    std::string name_, token_;
  };

  // options.store, else a RedisStore on options.address.
  RemoteTier(RemoteOptions options, Counters* counters, Warnings* warnings);

  // The payload of a valid value for key (stored under name), if there is one. *bad: a value is
  // there that failed a check (republish it with replace). count = false (polls): only hits
  // are counted.
  std::optional<std::string> Fetch(const CacheKey& key, const std::string& name, bool* bad,
                                   bool count = true);

  // Publishes payload as key's entry (nothing in read-only mode or over the size cap).
  // replace: overwrite what is there (a bad value, a rewritten record); else only if absent.
  void Publish(const CacheKey& key, const std::string& name, std::string_view payload,
               bool replace);

  // Takes name's compile lock, polling with backoff until it is held, until stop() returns true,
  // or until deadline; store errors end the wait. *waited: another holder was seen.
  // Read-only: returns an unheld lock at once.
  Lock Acquire(const std::string& name, absl::Time deadline, absl::FunctionRef<bool()> stop,
               bool* waited);

  Store& store() { return *store_; }
  const RemoteOptions& options() const { return options_; }
  bool read_only() const { return options_.read_only; }

 private:
  void Failed(const absl::Status& status);

  const RemoteOptions options_;
  Counters* const counters_;
  Warnings* const warnings_;
  std::shared_ptr<Store> store_;
};

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_REMOTE_TIER_H_
