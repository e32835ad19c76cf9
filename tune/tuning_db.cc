#include "tune/tuning_db.h"

#include <atomic>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cache/cache_key.h"
#include "fmt/format.h"

namespace fusejit::tune {
namespace {

constexpr std::string_view kRecordTitle = "fusejit tuning record 1";
// CacheKey::generator_version of every record entry: the record format, not fusejit's version
// (that one is inside the record, so that an entry of another version is found and reported).
constexpr std::string_view kRecordFormat = "fusejit-tuning-1";
constexpr uint64_t kMaxBytes = uint64_t{16} << 20;

// This Abseil's string_view is not std::string_view.
absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The kernel cache's warnings, reworded for the tuning database.
std::string Reword(std::string_view line) {
  std::string s(line);
  if (absl::StartsWith(s, "fusejit cache: ")) s = "fusejit tuning: " + s.substr(15);
  s = absl::StrReplaceAll(s, {{"; recompiling and replacing it", "; using the default configuration"},
                              {"; that kernel is compiled and not cached",
                               "; using the default configuration"},
                              {"; kernels are compiled and not cached",
                               "; tuned configurations are not used"}});
  s = absl::StrReplaceAll(s, {{"; recompiling", "; using the default configuration"},
                              {"cache entry", "tuning entry"},
                              {"remote cache value", "remote tuning record"},
                              {"cache directory", "tuning directory"}});
  return s;
}

void Emit(const std::function<void(std::string_view)>& sink, std::string_view line) {
  if (sink) {
    sink(line);
  } else {
    fmt::print(stderr, "{}\n", line);
    std::fflush(stderr);
  }
}

bool IsTrue(std::string_view v) {
  const std::string s = absl::AsciiStrToLower(AV(v));
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

// The record's fields, in order: name, and how to write and read it.
struct FieldIo {
  std::string_view name;
  std::function<std::string(const TuningRecord&)> get;
  std::function<bool(TuningRecord&, std::string_view)> set;
};

template <class T>
FieldIo Text(std::string_view name, T member) {
  return {name, [member](const TuningRecord& r) { return std::string(member(r)); },
          [member](TuningRecord& r, std::string_view v) {
            member(r) = std::string(v);
            return true;
          }};
}

template <class T>
FieldIo Int(std::string_view name, T member) {
  return {name, [member](const TuningRecord& r) { return absl::StrCat(member(r)); },
          [member](TuningRecord& r, std::string_view v) {
            return absl::SimpleAtoi(AV(v), &member(r));
          }};
}

template <class T>
FieldIo Real(std::string_view name, T member) {
  return {name, [member](const TuningRecord& r) { return fmt::format("{:.6f}", member(r)); },
          [member](TuningRecord& r, std::string_view v) {
            return absl::SimpleAtod(AV(v), &member(r));
          }};
}

const std::vector<FieldIo>& Fields() {
  static const auto* fields = new std::vector<FieldIo>{
      Text("spec", [](auto& r) -> auto& { return r.key.spec; }),
      Text("arch", [](auto& r) -> auto& { return r.key.arch; }),
      {"precision", [](const TuningRecord& r) { return std::string(PrecisionName(r.key.precision)); },
       [](TuningRecord& r, std::string_view v) {
         if (v == "fp32") {
           r.key.precision = Precision::kFp32;
         } else if (v == "tf32") {
           r.key.precision = Precision::kTf32;
         } else {
           return false;
         }
         return true;
       }},
      Text("device", [](auto& r) -> auto& { return r.key.device.name; }),
      Int("sm_count", [](auto& r) -> auto& { return r.key.device.sm_count; }),
      Int("driver_version", [](auto& r) -> auto& { return r.key.device.driver_version; }),
      Text("fusejit_version", [](auto& r) -> auto& { return r.fusejit_version; }),
      Text("config", [](auto& r) -> auto& { return r.config; }),
      Text("default_config", [](auto& r) -> auto& { return r.default_config; }),
      Real("default_ms", [](auto& r) -> auto& { return r.default_ms; }),
      Real("best_ms", [](auto& r) -> auto& { return r.best_ms; }),
      Int("tried", [](auto& r) -> auto& { return r.tried; }),
      Int("rejected", [](auto& r) -> auto& { return r.rejected; }),
      Int("failed", [](auto& r) -> auto& { return r.failed; }),
      Real("tuning_s", [](auto& r) -> auto& { return r.tuning_s; }),
      Text("tuned_at", [](auto& r) -> auto& { return r.tuned_at; }),
  };
  return *fields;
}

}  // namespace

std::string_view PrecisionName(Precision p) { return p == Precision::kTf32 ? "tf32" : "fp32"; }

cache::CacheKey TuningKey::ToCacheKey() const {
  cache::CacheKey k;
  k.source_hash = cache::HashBytesHex(
      fmt::format("{}\nspec: {}\narch: {}\nprecision: {}\ndevice: {}\nsm_count: {}\n",
                  kRecordFormat, spec, arch, PrecisionName(precision), device.name,
                  device.sm_count));
  k.generator_version = std::string(kRecordFormat);
  k.options = fmt::format("device={} sm_count={} precision={}", device.name, device.sm_count,
                          PrecisionName(precision));
  k.arch = arch;
  k.spec = spec;
  return k;
}

std::string TuningRecord::Encode() const {
  std::string s = absl::StrCat(AV(kRecordTitle), "\n");
  for (const FieldIo& f : Fields()) absl::StrAppend(&s, AV(f.name), ": ", f.get(*this), "\n");
  return s;
}

absl::StatusOr<TuningRecord> TuningRecord::Decode(std::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(AV(text), '\n');
  const std::vector<FieldIo>& fields = Fields();
  if (lines.size() != fields.size() + 2 || !lines.back().empty()) {
    return absl::DataLossError(fmt::format("record: {} lines, expected {}", lines.size() - 1,
                                           fields.size() + 1));
  }
  if (lines[0] != AV(kRecordTitle)) return absl::DataLossError("record: bad title line");
  TuningRecord r;
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string prefix = absl::StrCat(AV(fields[i].name), ": ");
    if (!absl::StartsWith(lines[i + 1], prefix)) {
      return absl::DataLossError(fmt::format("record: line {} is not '{}'", i + 2, fields[i].name));
    }
    const absl::string_view value = lines[i + 1].substr(prefix.size());
    if (!fields[i].set(r, std::string_view(value.data(), value.size()))) {
      return absl::DataLossError(fmt::format("record: bad {} value '{}'", fields[i].name,
                                             std::string(value)));
    }
  }
  return r;
}

namespace {
std::atomic<TuningDb*> default_override{nullptr};
}  // namespace

TuningDb* TuningDb::SetDefaultForTesting(TuningDb* db) { return default_override.exchange(db); }

TuningDb& TuningDb::Default() {
  if (TuningDb* o = default_override.load(std::memory_order_acquire)) return *o;
  static TuningDb* const db = [] {
    TuningDbOptions options;
    std::optional<std::string> off = cache::PosixEnv()->GetVar("FUSEJIT_DISABLE_TUNING");
    options.enabled = !(off.has_value() && IsTrue(*off));
    options.remote = cache::KernelCache::Default().options().remote;
    if (options.remote.has_value()) options.remote->prefix += "tuning:";
    return new TuningDb(std::move(options));
  }();
  return *db;
}

TuningDb::TuningDb(TuningDbOptions options) : options_(std::move(options)) {}

cache::KernelCache& TuningDb::store() const {
  absl::call_once(open_once_, [this] {
    std::string dir = options_.dir;
    if (dir.empty() && options_.enabled) {
      cache::KernelCache& kernels = cache::KernelCache::Default();
      if (kernels.disk_usable()) dir = kernels.directory() + "/tuning";
    }
    cache::CacheOptions c;
    c.dir = dir;
    c.max_bytes = kMaxBytes;
    c.disk_enabled = options_.enabled && !dir.empty();
    c.read_only = options_.read_only;
    c.env = options_.env;
    c.remote = options_.remote;
    c.warn = [sink = options_.warn](std::string_view line) { Emit(sink, Reword(line)); };
    store_ = std::make_unique<cache::KernelCache>(std::move(c));
  });
  return *store_;
}

std::string TuningDb::directory() const { return store().directory(); }
bool TuningDb::usable() const { return store().disk_usable(); }

void TuningDb::WarnOnce(const std::string& entry, std::string_view message) {
  {
    absl::MutexLock lock(&mu_);
    if (!warned_.insert(entry).second) return;
  }
  Emit(options_.warn, absl::StrCat("fusejit tuning: ", AV(message)));
}

absl::StatusOr<TuningRecord> TuningDb::Read(const TuningKey& key) {
  if (!usable()) return absl::NotFoundError("no tuning database");
  const cache::CacheKey ck = key.ToCacheKey();
  std::optional<std::string> payload = store().Lookup(ck);
  if (!payload.has_value()) {
    return absl::NotFoundError(fmt::format("no usable tuning entry {}/{}", directory(),
                                           ck.EntryName()));
  }
  return TuningRecord::Decode(*payload);
}

std::optional<codegen::TuneConfig> TuningDb::Find(const Chain& chain,
                                                  const codegen::PlanTarget& target,
                                                  const DeviceKey& device) {
  if (device.empty() || !usable()) return std::nullopt;
  TuningKey key{FormatChain(chain), target.arch, target.precision, device};
  const cache::CacheKey ck = key.ToCacheKey();
  std::optional<std::string> payload = store().Lookup(ck);  // warns about corrupt entries
  if (!payload.has_value()) return std::nullopt;
  const std::string path = fmt::format("{}/{}", directory(), ck.EntryName());
  auto fallback = [&](std::string_view why) -> std::optional<codegen::TuneConfig> {
    WarnOnce(ck.EntryName(),
             fmt::format("tuning entry {} ({}): {}; using the default configuration (re-run "
                         "fusejit autotune to replace it)",
                         path, key.spec, why));
    return std::nullopt;
  };
  absl::StatusOr<TuningRecord> record = TuningRecord::Decode(*payload);
  if (!record.ok()) return fallback(std::string(record.status().message()));
  const TuningKey& found = record->key;
  if (found.spec != key.spec || found.arch != key.arch || found.precision != key.precision ||
      found.device.name != key.device.name || found.device.sm_count != key.device.sm_count) {
    return fallback("it belongs to another chain or device");
  }
  if (record->fusejit_version != GeneratorBuild()) {
    return fallback(
        fmt::format("stale: written by {}, this is {}", record->fusejit_version, GeneratorBuild()));
  }
  if (found.device.driver_version != device.driver_version) {
    return fallback(fmt::format("stale: measured with driver {}, this is driver {}",
                                found.device.driver_version, device.driver_version));
  }
  absl::StatusOr<codegen::TuneConfig> config = codegen::TuneConfig::Parse(record->config);
  if (!config.ok()) return fallback(std::string(config.status().message()));
  if (absl::Status s = codegen::ValidateConfig(chain, target, *config); !s.ok()) {
    return fallback(std::string(s.message()));
  }
  return *std::move(config);
}

absl::Status TuningDb::Store(const TuningRecord& record) {
  for (const FieldIo& f : Fields()) {
    const std::string v = f.get(record);
    if (v.find('\n') != std::string::npos || v.find('\r') != std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("tuning record: {} must be one line", f.name));
    }
  }
  if (!usable()) {
    return absl::FailedPreconditionError(
        fmt::format("no usable tuning database ({})", store().disk_status()));
  }
  return store().Put(record.key.ToCacheKey(), record.Encode());
}

}  // namespace fusejit::tune
