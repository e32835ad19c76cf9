#include "tools/cmd_cache.h"

#include <ctime>
#include <filesystem>
#include <system_error>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "cache/kernel_cache.h"
#include "fmt/format.h"

namespace fusejit::tools {
namespace {

constexpr char kUsage[] =
    "usage: fusejit cache <command> [--cache-dir DIR]\n"
    "\n"
    "commands:\n"
    "  stats           directory, state, entries and bytes on disk, size limit; the remote\n"
    "                  tier: reachable, entries, the fleet's hits, misses, rejected values\n"
    "  list            every entry: name, size, last use, key fields, spec\n"
    "  verify [--fix]  re-check every entry's checksum and key; --fix deletes bad ones\n"
    "  verify --remote [--fix]  the same for the remote tier's values\n"
    "  clear           delete every entry (and temp/lock files) from the directory\n"
    "\n"
    "The directory is --cache-dir, else $FUSEJIT_CACHE_DIR, else $XDG_CACHE_HOME/fusejit,\n"
    "else ~/.cache/fusejit. FUSEJIT_CACHE_MAX_BYTES sets the limit (default 1G).\n"
    "The remote tier is FUSEJIT_REMOTE_CACHE (redis://[[user]:password@]host[:port][/db] or\n"
    "unix:///path/to/redis.sock).\n";

std::string FormatTime(int64_t ns) {
  const std::time_t t = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm;
  if (localtime_r(&t, &tm) == nullptr) return "?";
  char buf[32];
  if (std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm) == 0) return "?";
  return buf;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < uint64_t{1} << 30) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  return fmt::format("{:.1f} GiB", bytes / 1073741824.0);
}

// The remote tier's part of `stats`; 1 when it is configured and does not answer.
int RemoteStats(cache::KernelCache& c, std::ostream& out) {
  if (!c.remote_configured()) {
    out << "remote        none (FUSEJIT_REMOTE_CACHE shares kernels through Redis)\n";
    return 0;
  }
  out << fmt::format("remote        {}\n", c.remote_description());
  if (absl::Status s = c.RemotePing(); !s.ok()) {
    out << fmt::format("reachable     no: {}\n", std::string(s.message()));
    return 1;
  }
  out << "reachable     yes\n";
  if (absl::StatusOr<cache::StoreUsage> u = c.RemoteUsage(); u.ok()) {
    out << fmt::format("remote entries {} ({})\n", u->entries, FormatBytes(u->entry_bytes));
  }
  // Fleet-wide: every process with this remote tier counts into it.
  std::map<std::string, int64_t> counters;
  if (auto fleet = c.RemoteCounters(); fleet.ok()) counters.insert(fleet->begin(), fleet->end());
  out << fmt::format("remote hits   {}\n", counters["hits"]);
  out << fmt::format("remote misses {}\n", counters["misses"]);
  out << fmt::format("remote rejected {}\n", counters["rejected"]);
  out << fmt::format("remote published {}\n", counters["published"]);
  out << "(remote counters are the fleet's, since the Redis database was created)\n";
  return 0;
}

int Stats(cache::KernelCache& c, std::ostream& out, std::ostream& err) {
  out << fmt::format("directory     {}\n", c.directory().empty() ? "(none)" : c.directory());
  out << fmt::format("state         {}\n", c.disk_status());
  if (c.max_bytes() == 0) {
    out << "limit         none\n";
  } else {
    out << fmt::format("limit         {} ({} bytes)\n", FormatBytes(c.max_bytes()), c.max_bytes());
  }
  if (!c.disk_usable() && c.disk_state() != cache::DiskState::kMissing) {
    RemoteStats(c, out);
    return 1;
  }
  absl::StatusOr<cache::DiskUsage> usage = c.Usage();
  if (!usage.ok()) {
    err << "fusejit cache stats: " << usage.status().message() << "\n";
    return 1;
  }
  out << fmt::format("entries       {}\n", usage->entries);
  if (c.max_bytes() == 0) {  // FUSEJIT_CACHE_MAX_BYTES=0: no limit, so no share of one
    out << fmt::format("entry bytes   {} ({} bytes, no limit)\n", FormatBytes(usage->entry_bytes),
                       usage->entry_bytes);
  } else {
    out << fmt::format("entry bytes   {} ({} bytes, {:.1f}% of the limit)\n",
                       FormatBytes(usage->entry_bytes), usage->entry_bytes,
                       100.0 * usage->entry_bytes / c.max_bytes());
  }
  out << fmt::format("temp files    {} ({} bytes)\n", usage->temp_files, usage->temp_bytes);
  out << fmt::format("lock files    {}\n", usage->lock_files);
  out << "(hit/miss counters are per process: see KernelCache::Stats)\n";
  return RemoteStats(c, out);
}

int List(cache::KernelCache& c, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::vector<cache::EntryInfo>> entries = c.List();
  if (!entries.ok()) {
    err << "fusejit cache list: " << entries.status().message() << "\n";
    return 1;
  }
  out << fmt::format("{:<16}  {:>10}  {:<19}  {:<7}  {:<6}  {:<16}  {:<16}  {}\n", "ENTRY", "BYTES",
                     "LAST USED", "ARCH", "NVRTC", "GENERATOR", "SOURCE", "OPTIONS | SPEC");
  uint64_t total = 0;
  for (const cache::EntryInfo& e : *entries) {
    total += e.file_bytes;
    const std::string name = e.name.substr(0, 16);
    if (!e.key.has_value()) {
      out << fmt::format("{:<16}  {:>10}  {:<19}  BAD: {}\n", name, e.file_bytes,
                         FormatTime(e.mtime_ns), e.problem);
      continue;
    }
    out << fmt::format("{:<16}  {:>10}  {:<19}  {:<7}  {:<6}  {:<16}  {:<16}  {} | {}\n", name,
                       e.file_bytes, FormatTime(e.mtime_ns), e.key->arch, e.key->nvrtc_version,
                       e.key->generator_version, e.key->source_hash.substr(0, 16), e.key->options,
                       e.key->spec);
  }
  out << fmt::format("{} entries, {}\n", entries->size(), FormatBytes(total));
  return 0;
}

int Verify(cache::KernelCache& c, bool fix, bool remote, std::ostream& out, std::ostream& err) {
  absl::StatusOr<cache::VerifyReport> report = remote ? c.VerifyRemote(fix) : c.Verify(fix);
  if (!report.ok()) {
    err << "fusejit cache verify: " << report.status().message() << "\n";
    return 1;
  }
  for (const auto& [name, problem] : report->bad) {
    out << fmt::format("BAD {}: {}\n", name, problem);
  }
  out << fmt::format("checked {} {}entries: {} ok, {} bad", report->checked,
                     remote ? "remote " : "", report->ok, report->bad.size());
  if (fix) out << fmt::format(", {} removed", report->removed);
  out << "\n";
  if (report->bad.empty()) return 0;
  return fix && report->removed == report->bad.size() ? 0 : 1;
}

int Clear(cache::KernelCache& c, std::ostream& out, std::ostream& err) {
  absl::StatusOr<size_t> removed = c.Clear();
  if (!removed.ok()) {
    err << "fusejit cache clear: " << removed.status().message() << "\n";
    return 1;
  }
  out << fmt::format("removed {} files from {}\n", *removed,
                     c.directory().empty() ? "(none)" : c.directory());
  return 0;
}

}  // namespace

int RunCacheCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string command;
  std::optional<std::string> dir;
  bool fix = false;
  bool remote = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h" || a == "help") {
      out << kUsage;
      return 0;
    } else if (a == "--cache-dir") {
      if (i + 1 >= args.size()) {
        err << "fusejit cache: --cache-dir needs a directory\n" << kUsage;
        return 2;
      }
      dir = args[++i];
    } else if (absl::StartsWith(a, "--cache-dir=")) {
      dir = a.substr(sizeof("--cache-dir=") - 1);
    } else if (a == "--fix") {
      fix = true;
    } else if (a == "--remote") {
      remote = true;
    } else if (!a.empty() && a[0] == '-') {
      err << fmt::format("fusejit cache: unknown flag '{}'\n", a) << kUsage;
      return 2;
    } else if (command.empty()) {
      command = a;
    } else {
      err << fmt::format("fusejit cache: unexpected argument '{}'\n", a) << kUsage;
      return 2;
    }
  }
  if (command.empty()) {
    err << "fusejit cache: missing command\n" << kUsage;
    return 2;
  }
  if (command != "stats" && command != "list" && command != "verify" && command != "clear") {
    err << fmt::format("fusejit cache: unknown command '{}'\n", command) << kUsage;
    return 2;
  }
  if (fix && command != "verify") {
    err << "fusejit cache: --fix only applies to verify\n";
    return 2;
  }
  if (remote && command != "verify") {
    err << "fusejit cache: --remote only applies to verify (stats always shows the remote tier)\n";
    return 2;
  }
  if (dir.has_value() && dir->empty()) {
    err << "fusejit cache: --cache-dir is empty\n";
    return 2;
  }
  if (dir.has_value() && (*dir)[0] != '/') {
    // A command-line path is relative to the working directory; the cache itself only takes
    // absolute paths (a relative FUSEJIT_CACHE_DIR is refused: it would differ per process).
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(*dir, ec);
    if (ec) {
      err << fmt::format("fusejit cache: --cache-dir {}: {}\n", *dir, ec.message());
      return 2;
    }
    dir = absolute.string();
  }
  cache::CacheOptions options = cache::CacheOptionsFromEnvironment();
  options.disk_enabled = true;  // FUSEJIT_DISABLE_CACHE turns off use, not management
  options.create_directory = false;
  if (dir.has_value()) options.dir = *dir;
  options.warn = [&err](std::string_view line) { err << line << "\n"; };
  cache::KernelCache c(options);
  if (command == "stats") return Stats(c, out, err);
  if (command == "list") return List(c, out, err);
  if (command == "verify") return Verify(c, fix, remote, out, err);
  return Clear(c, out, err);
}

}  // namespace fusejit::tools
