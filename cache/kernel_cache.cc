#include "cache/kernel_cache.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "cache/cache_dir.h"
#include "cache/dir_store.h"
#include "cache/local_tier.h"
#include "cache/remote_tier.h"
#include "fmt/format.h"

namespace fusejit::cache {

// One in-process compile of a key that other threads may wait for.
struct KernelCache::Flight {
  absl::Notification done;
  absl::StatusOr<std::string> result;
  bool disk_hit = false;
};

namespace {
thread_local KeyRecorder* current_recorder = nullptr;
}  // namespace

KeyRecorder::KeyRecorder() : outer_(current_recorder) { current_recorder = this; }
KeyRecorder::~KeyRecorder() { current_recorder = outer_; }

std::optional<uint64_t> ParseByteSize(std::string_view input) {
  absl::string_view text =
      absl::StripAsciiWhitespace(absl::string_view(input.data(), input.size()));
  if (text.empty()) return std::nullopt;
  uint64_t multiplier = 1;
  switch (absl::ascii_tolower(static_cast<unsigned char>(text.back()))) {
    case 'k':
      multiplier = uint64_t{1} << 10;
      break;
    case 'm':
      multiplier = uint64_t{1} << 20;
      break;
    case 'g':
      multiplier = uint64_t{1} << 30;
      break;
    case 't':
      multiplier = uint64_t{1} << 40;
      break;
    default:
      break;
  }
  if (multiplier != 1) text.remove_suffix(1);
  uint64_t value = 0;
  if (text.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(text[0])) ||
      !absl::SimpleAtoi(text, &value) || value > UINT64_MAX / multiplier) {
    return std::nullopt;
  }
  return value * multiplier;
}

CacheOptions CacheOptionsFromEnvironment(Env* env) {
  if (env == nullptr) env = PosixEnv();
  CacheOptions options;
  options.env = env;
  if (std::optional<std::string> dir = env->GetVar("FUSEJIT_CACHE_DIR")) options.dir = *dir;
  if (std::optional<std::string> max = env->GetVar("FUSEJIT_CACHE_MAX_BYTES")) {
    if (std::optional<uint64_t> bytes = ParseByteSize(*max)) {
      options.max_bytes = *bytes;
    } else {
      fmt::print(stderr,
                 "fusejit cache: ignoring FUSEJIT_CACHE_MAX_BYTES='{}': expected bytes, or a "
                 "number with a K, M or G suffix; the limit stays {} bytes\n",
                 *max, options.max_bytes);
    }
  }
  if (std::optional<std::string> off = env->GetVar("FUSEJIT_DISABLE_CACHE")) {
    const std::string v =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(absl::string_view(*off)));
    if (v == "1" || v == "true" || v == "yes" || v == "on") options.disk_enabled = false;
  }
  options.remote = RemoteOptionsFromEnvironment(env);
  return options;
}

std::string CacheStats::ToString() const {
  return fmt::format(
      "hits_memory {}\nhits_disk {}\nmisses {}\nuncached {}\ncoalesced {}\nlock_waits {}\n"
      "compiles {}\ncompile_failures {}\ncompile_ms {:.1f}\nbytes_read {}\nbytes_written {}\n"
      "entries_written {}\nevictions {}\nevicted_bytes {}\ntemp_files_swept {}\n"
      "rejected_entries {}\nread_failures {}\nwrite_failures {}\nlock_failures {}\n"
      "remote_hits {}\nremote_misses {}\nremote_rejected {}\nremote_published {}\n"
      "remote_write_failures {}\nremote_errors {}\nremote_lock_waits {}\nremote_bytes_read {}\n"
      "remote_bytes_written {}\n",
      hits_memory, hits_disk, misses, uncached, coalesced, lock_waits, compiles, compile_failures,
      compile_ms, bytes_read, bytes_written, entries_written, evictions, evicted_bytes,
      temp_files_swept, rejected_entries, read_failures, write_failures, lock_failures,
      remote_hits, remote_misses, remote_rejected, remote_published, remote_write_failures,
      remote_errors, remote_lock_waits, remote_bytes_read, remote_bytes_written);
}

KernelCache& KernelCache::Default() {
  static KernelCache* const cache = new KernelCache(CacheOptionsFromEnvironment());
  return *cache;
}

KernelCache::KernelCache(CacheOptions options)
    : options_(std::move(options)),
      counters_(std::make_unique<Counters>()),
      warnings_(std::make_unique<Warnings>(options_.warn)),
      remote_fill_(options_.remote_fill) {
  if (options_.remote.has_value()) {
    remote_ = std::make_unique<RemoteTier>(*options_.remote, counters_.get(), warnings_.get());
  }
}

KernelCache::~KernelCache() = default;

LocalTier& KernelCache::local() const {
  absl::call_once(open_once_, [this] {
    std::shared_ptr<LocalStore> store = options_.store;
    if (store == nullptr || !options_.disk_enabled) {
      store = std::make_shared<DirStore>(options_, counters_.get(), warnings_.get());
    }
    local_ =
        std::make_unique<LocalTier>(std::move(store), options_, counters_.get(), warnings_.get());
  });
  return *local_;
}

std::string KernelCache::directory() const { return local().store().Describe(); }
DiskState KernelCache::disk_state() const { return local().store().state(); }
std::string KernelCache::disk_status() const { return local().store().status_text(); }

void KernelCache::RecordMemoryHit() { counters_->hits_memory++; }

CacheStats KernelCache::Stats() const {
  const Counters& c = *counters_;
  CacheStats s;
  s.hits_memory = c.hits_memory;
  s.hits_disk = c.hits_disk;
  s.misses = c.misses;
  s.uncached = c.uncached;
  s.coalesced = c.coalesced;
  s.lock_waits = c.lock_waits;
  s.compiles = c.compiles;
  s.compile_failures = c.compile_failures;
  s.compile_ms = static_cast<double>(c.compile_us.load()) / 1000.0;
  s.bytes_read = c.bytes_read;
  s.bytes_written = c.bytes_written;
  s.entries_written = c.entries_written;
  s.evictions = c.evictions;
  s.evicted_bytes = c.evicted_bytes;
  s.temp_files_swept = c.temp_files_swept;
  s.rejected_entries = c.rejected_entries;
  s.read_failures = c.read_failures;
  s.write_failures = c.write_failures;
  s.lock_failures = c.lock_failures;
  s.remote_hits = c.remote_hits;
  s.remote_misses = c.remote_misses;
  s.remote_rejected = c.remote_rejected;
  s.remote_published = c.remote_published;
  s.remote_write_failures = c.remote_write_failures;
  s.remote_errors = c.remote_errors;
  s.remote_lock_waits = c.remote_lock_waits;
  s.remote_bytes_read = c.remote_bytes_read;
  s.remote_bytes_written = c.remote_bytes_written;
  return s;
}

std::optional<std::string> KernelCache::Lookup(const CacheKey& key) {
  const std::string name = key.EntryName();
  bool refused = false;
  if (local().usable()) {
    if (std::optional<std::string> p = local().Read(key, name, &refused)) return p;
  }
  if (remote_ == nullptr) return std::nullopt;
  bool bad = false;
  std::optional<std::string> payload = remote_->Fetch(key, name, &bad);
  // A refused entry (a symlink, another user's file) is left alone, never written over.
  if (payload.has_value() && !refused) KeepRemoteHit(key, name, *payload);
  return payload;
}

absl::Status KernelCache::Put(const CacheKey& key, std::string_view payload) {
  LocalTier& d = local();
  if (remote_ != nullptr) remote_->Publish(key, key.EntryName(), payload, /*replace=*/true);
  if (!d.writable()) {
    return absl::FailedPreconditionError(fmt::format(
        "cache directory {} is not writable: {}", d.store().Describe(), d.store().status_text()));
  }
  if (!d.Publish(key, key.EntryName(), payload)) {
    return absl::UnavailableError(
        fmt::format("could not write {} (see the warning)", d.store().Locate(key.EntryName())));
  }
  (void)d.Trim();  // faults are counted and warned about inside
  return absl::OkStatus();
}

absl::StatusOr<std::string> KernelCache::RunCompile(
    absl::FunctionRef<absl::StatusOr<std::string>()> compile) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> result = compile();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  counters_->compiles++;
  counters_->compile_us += static_cast<uint64_t>(us);
  if (!result.ok()) counters_->compile_failures++;
  return result;
}

absl::StatusOr<std::string> KernelCache::GetOrCompile(
    const CacheKey& key, absl::FunctionRef<absl::StatusOr<std::string>()> compile, bool* disk_hit) {
  if (disk_hit != nullptr) *disk_hit = false;
  if (current_recorder != nullptr) current_recorder->keys_.push_back(key);
  const std::string name = key.EntryName();
  bool use_disk = local().usable();
  if (use_disk) {
    bool refused = false;
    if (std::optional<std::string> payload = local().Read(key, name, &refused)) {
      if (disk_hit != nullptr) *disk_hit = true;
      if (remote_ != nullptr && remote_fill_) {
        bool bad = false;
        if (!remote_->Fetch(key, name, &bad).has_value()) {
          remote_->Publish(key, name, *payload, /*replace=*/bad);
        }
      }
      return *std::move(payload);
    }
    use_disk = !refused;
  }

  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Flight>& slot = flights_[name];
    if (slot == nullptr) {
      slot = std::make_shared<Flight>();
      leader = true;
    }
    flight = slot;
  }
  if (!leader) {
    counters_->coalesced++;
    flight->done.WaitForNotification();
    if (disk_hit != nullptr) *disk_hit = flight->disk_hit;
    return flight->result;
  }
  // Followers are released even if compile() unwinds (they then get an UNKNOWN status).
  absl::Cleanup release = [&] {
    {
      absl::MutexLock lock(&mu_);
      flights_.erase(name);
    }
    flight->done.Notify();
  };
  flight->result = Lead(key, name, use_disk, compile, &flight->disk_hit);
  std::move(release).Invoke();
  if (disk_hit != nullptr) *disk_hit = flight->disk_hit;
  return flight->result;
}

absl::StatusOr<std::string> KernelCache::Lead(
    const CacheKey& key, const std::string& name, bool use_disk,
    absl::FunctionRef<absl::StatusOr<std::string>()> compile, bool* disk_hit) {
  LocalTier& d = local();
  bool refused = false;
  LocalTier::Lock lock;
  if (use_disk && d.writable()) {
    // Wait for another process compiling this key; read its entry as soon as it appears.
    std::optional<std::string> published;
    bool waited = false;
    lock = d.Acquire(
        name, absl::Now() + options_.lock_timeout,
        [&] {
          published = d.Read(key, name, &refused, /*count=*/false);
          return published.has_value() || refused;
        },
        &waited);
    if (waited) counters_->lock_waits++;
    if (published.has_value()) {
      *disk_hit = true;
      return *std::move(published);
    }
  }
  // Re-check: another process may have published between our first read and the lock.
  if (use_disk && !refused) {
    if (std::optional<std::string> payload = d.Read(key, name, &refused, /*count=*/false)) {
      *disk_hit = true;
      return *std::move(payload);
    }
  }
  if (refused) use_disk = false;  // that entry is left alone; the kernel is not cached on disk

  // The remote tier: another machine's compile, or wait for the one compiling it now.
  bool remote_bad = false;
  RemoteTier::Lock remote_lock;
  if (remote_ != nullptr) {
    std::optional<std::string> payload = remote_->Fetch(key, name, &remote_bad);
    if (!payload.has_value()) {
      bool waited = false;
      remote_lock = remote_->Acquire(
          name, absl::Now() + options_.lock_timeout,
          [&] {
            bool bad = false;
            payload = remote_->Fetch(key, name, &bad, /*count=*/false);
            return payload.has_value();
          },
          &waited);
      // Re-check after taking it: the holder may have published and released in between.
      if (!payload.has_value() && remote_lock.held()) {
        payload = remote_->Fetch(key, name, &remote_bad, /*count=*/false);
      }
    }
    if (payload.has_value()) {
      remote_lock.Release();
      if (use_disk) KeepRemoteHit(key, name, *payload);
      *disk_hit = true;
      return *std::move(payload);
    }
  }

  if (use_disk) {
    counters_->misses++;
  } else {
    counters_->uncached++;
  }
  absl::StatusOr<std::string> result = RunCompile(compile);
  if (!result.ok()) {
    remote_lock.Release();
    lock.Release(/*delete_file=*/true);  // no lock file is left behind
    return result;
  }
  const bool published = use_disk && d.Publish(key, name, *result);
  if (remote_ != nullptr) remote_->Publish(key, name, *result, /*replace=*/remote_bad);
  remote_lock.Release();
  lock.Release(/*delete_file=*/true);
  if (published) (void)d.Trim();  // faults are counted and warned about inside
  return result;
}

absl::StatusOr<std::vector<EntryInfo>> KernelCache::List() { return local().List(); }
absl::StatusOr<VerifyReport> KernelCache::Verify(bool remove_bad) {
  return local().Verify(remove_bad);
}
absl::StatusOr<size_t> KernelCache::Clear() { return local().Clear(); }
absl::StatusOr<DiskUsage> KernelCache::Usage() { return local().Usage(); }
absl::Status KernelCache::Trim() { return local().Trim(); }

}  // namespace fusejit::cache
