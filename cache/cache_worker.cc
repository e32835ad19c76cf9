// fusejit_cache_worker: one process of the multi-process cache tests (tests/cache/cache_process_test.cc).
//
//   fusejit_cache_worker get DIR SEED [flags]         GetOrCompile one key, check the payload
//   fusejit_cache_worker loop DIR NKEYS ITERS [flags] GetOrCompile random keys, check each payload
//   fusejit_cache_worker watch DIR SEED MS [flags]    Lookup one key for MS ms: never a bad entry
//   fusejit_cache_worker name VARIANT                 print the EntryName of a fixed request
// flags: --compile-ms N (compile() sleeps), --payload-bytes N, --max-bytes N,
//        --slow-us N and --chunk N (every file call sleeps N us; writes of at most N bytes),
//        --remote URL (a remote tier: FUSEJIT_REMOTE_CACHE's forms), --remote-read-only 1,
//        --retry-ms N (its circuit breaker's interval), --lock-ttl-ms N,
//        --pause-mid-write-ms N (at the second write of an entry, print "writing" and sleep N ms:
//        a test that kills then is sure to kill in the middle of a publish).
// Prints one line "result key=value ..." and exits 0 when every payload was right, else 1.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "cache/kernel_cache.h"
#include "cache/testing.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

struct Flags {
  int compile_ms = 0;
  size_t payload_bytes = 4096;
  uint64_t max_bytes = uint64_t{1} << 30;
  int slow_us = 0;
  size_t chunk = 1 << 20;
  std::string remote;
  bool remote_read_only = false;
  int retry_ms = -1;
  int lock_ttl_ms = -1;
  int pause_mid_write_ms = 0;
};

// SlowEnv that announces the middle of the first publish on stdout and holds still there.
class PausingEnv : public testing::SlowEnv {
 public:
  PausingEnv(Env* base, absl::Duration delay, size_t max_write, absl::Duration pause)
      : SlowEnv(base, delay, max_write), pause_(pause) {}
  absl::StatusOr<size_t> Write(int fd, const char* buf, size_t n) override {
    if (pause_ > absl::ZeroDuration() && ++writes_ == 2) {
      std::fputs("writing\n", stdout);
      std::fflush(stdout);
      absl::SleepFor(pause_);
    }
    return SlowEnv::Write(fd, buf, n);
  }

 private:
  const absl::Duration pause_;
  int writes_ = 0;
};

int Usage() {
  std::fputs("usage: fusejit_cache_worker get|loop|watch|name ... (see cache_worker.cc)\n", stderr);
  return 2;
}

bool ParseFlags(const std::vector<std::string>& args, size_t first, Flags* f) {
  for (size_t i = first; i < args.size(); i += 2) {
    if (i + 1 >= args.size()) return false;
    if (args[i] == "--remote") {
      f->remote = args[i + 1];
      continue;
    }
    uint64_t v = 0;
    if (!absl::SimpleAtoi(args[i + 1], &v)) return false;
    if (args[i] == "--compile-ms") {
      f->compile_ms = static_cast<int>(v);
    } else if (args[i] == "--payload-bytes") {
      f->payload_bytes = v;
    } else if (args[i] == "--max-bytes") {
      f->max_bytes = v;
    } else if (args[i] == "--slow-us") {
      f->slow_us = static_cast<int>(v);
    } else if (args[i] == "--chunk") {
      f->chunk = v;
    } else if (args[i] == "--remote-read-only") {
      f->remote_read_only = v != 0;
    } else if (args[i] == "--retry-ms") {
      f->retry_ms = static_cast<int>(v);
    } else if (args[i] == "--pause-mid-write-ms") {
      f->pause_mid_write_ms = static_cast<int>(v);
    } else if (args[i] == "--lock-ttl-ms") {
      f->lock_ttl_ms = static_cast<int>(v);
    } else {
      return false;
    }
  }
  return true;
}

int Main(const std::vector<std::string>& args) {
  if (args.size() < 2) return Usage();
  const std::string& mode = args[1];
  if (mode == "name") {
    if (args.size() != 3) return Usage();
    // A fixed request, as the compile pipeline would build it; VARIANT changes the source.
    const std::vector<std::string> headers = {"#pragma once\n#define TILE 16\n",
                                              "template <int N> struct V {};\n"};
    CacheKey key;
    key.source_hash =
        HashSource(fmt::format("// {}\n__global__ void k() {{}}\n", args[2]), headers);
    key.generator_version = "fusejit 0.1.0";
    key.nvrtc_version = "13.0";
    key.options = "--gpu-architecture=sm_90 --std=c++17";
    key.arch = "sm_90";
    fmt::print("result name={} source_hash={}\n", key.EntryName(), key.source_hash);
    return 0;
  }
  if (args.size() < 4) return Usage();
  const std::string& dir = args[2];
  int a = 0, b = 0;
  if (!absl::SimpleAtoi(args[3], &a)) return Usage();
  const size_t flags_from = mode == "get" ? 4 : 5;
  if (mode != "get" && (args.size() < 5 || !absl::SimpleAtoi(args[4], &b))) return Usage();
  Flags flags;
  if (!ParseFlags(args, flags_from, &flags)) return Usage();

  PausingEnv slow(PosixEnv(), absl::Microseconds(flags.slow_us), flags.chunk,
                  absl::Milliseconds(flags.pause_mid_write_ms));
  CacheOptions options;
  options.dir = dir;
  options.max_bytes = flags.max_bytes;
  options.env = flags.slow_us > 0 || flags.chunk < (1u << 20) || flags.pause_mid_write_ms > 0
                    ? &slow
                    : PosixEnv();
  if (!flags.remote.empty()) {
    absl::StatusOr<RedisAddress> address = ParseRedisUrl(flags.remote);
    if (!address.ok()) {
      fmt::print(stderr, "--remote: {}\n", address.status().ToString());
      return Usage();
    }
    RemoteOptions remote;
    remote.address = *address;
    remote.read_only = flags.remote_read_only;
    if (flags.retry_ms >= 0) remote.retry_interval = absl::Milliseconds(flags.retry_ms);
    if (flags.lock_ttl_ms >= 0) remote.lock_ttl = absl::Milliseconds(flags.lock_ttl_ms);
    options.remote = remote;
  }
  KernelCache cache(options);

  int compiled = 0, hits = 0, absent = 0, errors = 0;
  auto get = [&](int seed) {
    bool disk_hit = false;
    absl::StatusOr<std::string> payload = cache.GetOrCompile(
        testing::TestKey(seed),
        [&]() -> absl::StatusOr<std::string> {
          ++compiled;
          absl::SleepFor(absl::Milliseconds(flags.compile_ms));
          return testing::TestPayload(seed, flags.payload_bytes);
        },
        &disk_hit);
    if (!payload.ok() || *payload != testing::TestPayload(seed, flags.payload_bytes)) {
      ++errors;
      fmt::print(stderr, "worker {}: wrong result for seed {}: {}\n", ::getpid(), seed,
                 payload.ok() ? "payload differs" : payload.status().ToString());
    }
    hits += disk_hit ? 1 : 0;
  };
  if (mode == "get") {
    std::fputs("started\n", stdout);  // tests that kill at random times start the clock here
    std::fflush(stdout);
    get(a);
  } else if (mode == "loop") {
    std::mt19937 rng(static_cast<unsigned>(::getpid()));
    for (int i = 0; i < b; ++i) get(static_cast<int>(rng() % static_cast<unsigned>(a)));
  } else if (mode == "watch") {
    const absl::Time end = absl::Now() + absl::Milliseconds(b);
    const CacheKey key = testing::TestKey(a);
    while (absl::Now() < end) {
      std::optional<std::string> payload = cache.Lookup(key);
      if (!payload.has_value()) {
        ++absent;
      } else if (*payload == testing::TestPayload(a, flags.payload_bytes)) {
        ++hits;
      } else {
        ++errors;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  } else {
    return Usage();
  }
  const CacheStats stats = cache.Stats();
  errors += static_cast<int>(stats.rejected_entries + stats.read_failures);
  fmt::print(
      "result compiled={} hits={} absent={} errors={} evictions={} write_failures={} "
      "lock_waits={} disk_usable={} remote_hits={} remote_misses={} remote_published={} "
      "remote_rejected={} remote_errors={} remote_lock_waits={}\n",
      compiled, hits, absent, errors, stats.evictions, stats.write_failures, stats.lock_waits,
      cache.disk_usable() ? 1 : 0, stats.remote_hits, stats.remote_misses, stats.remote_published,
      stats.remote_rejected, stats.remote_errors, stats.remote_lock_waits);
  std::fflush(stdout);
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fusejit::cache

int main(int argc, char** argv) {
  return fusejit::cache::Main(std::vector<std::string>(argv, argv + argc));
}
