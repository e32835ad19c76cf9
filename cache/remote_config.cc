#include "cache/remote_config.h"

#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "cache/env.h"
#include "cache/kernel_cache.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Bad(std::string_view why) {
  return absl::InvalidArgumentError(fmt::format("{}; expected {}", why, kRemoteUrlForms));
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX escapes, as in URLs (a password may hold '@' or ':').
absl::StatusOr<std::string> PercentDecode(std::string_view s, std::string_view what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return Bad(fmt::format("bad %-escape in the {}", what));
    const int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
    if (hi < 0 || lo < 0) return Bad(fmt::format("bad %-escape in the {}", what));
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

bool IsTrue(std::string_view v) {
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(AV(v)));
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

void Warn(std::string_view message) {
  fmt::print(stderr, "fusejit cache: {}\n", message);
  std::fflush(stderr);
}

// A millisecond count from name, if set and valid (else warned about: the default stays).
void ReadMs(Env* env, const char* name, int64_t min_ms, absl::Duration* out) {
  std::optional<std::string> v = env->GetVar(name);
  if (!v.has_value() || v->empty()) return;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(AV(*v), &ms) || ms < min_ms || ms > 86400000) {
    Warn(fmt::format("ignoring {}='{}': expected milliseconds, {} to 86400000; keeping {} ms",
                     name, *v, min_ms, absl::ToInt64Milliseconds(*out)));
    return;
  }
  *out = absl::Milliseconds(ms);
}

}  // namespace

std::string RedisAddress::Display() const {
  if (!unix_path.empty()) return "unix://" + unix_path;
  std::string login;
  if (!user.empty() || !password.empty()) login = fmt::format("{}:***@", user);
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return fmt::format("redis://{}{}:{}/{}", login, h, port, db);
}

absl::StatusOr<RedisAddress> ParseRedisUrl(std::string_view url) {
  RedisAddress a;
  std::string_view rest = url;
  if (rest.substr(0, 7) == "unix://") {
    rest.remove_prefix(7);
    if (rest.empty() || rest[0] != '/') return Bad("unix:// needs an absolute socket path");
    a.unix_path = std::string(rest);
    return a;
  }
  if (rest.substr(0, 8) != "redis://") {
    return Bad(rest.find("://") == std::string_view::npos ? "no scheme"
                                                           : "unknown scheme (rediss:// and "
                                                             "others are not supported)");
  }
  rest.remove_prefix(8);
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  const size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view login = authority.substr(0, at);
    authority.remove_prefix(at + 1);
    const size_t colon = login.find(':');
    if (colon == std::string_view::npos) {
      return Bad("the login before '@' must be user:password or :password");
    }
    absl::StatusOr<std::string> user = PercentDecode(login.substr(0, colon), "user");
    if (!user.ok()) return user.status();
    absl::StatusOr<std::string> password = PercentDecode(login.substr(colon + 1), "password");
    if (!password.ok()) return password.status();
    if (password->empty()) return Bad("empty password after ':'");
    a.user = *user;
    a.password = *password;
  }
  std::string_view port_text;
  bool has_port = false;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return Bad("unclosed '[' in the host");
    a.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Bad("unexpected text after ']'");
      port_text = after.substr(1);
      has_port = true;
    }
  } else {
    const size_t colon = authority.find(':');
    a.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (a.host.empty()) return Bad("no host");
  if (has_port) {
    int port = 0;
    if (!absl::SimpleAtoi(AV(port_text), &port) || port < 1 || port > 65535) {
      return Bad(fmt::format("port '{}' is not a number from 1 to 65535", port_text));
    }
    a.port = port;
  }
  if (!path.empty()) {
    int db = 0;
    if (!absl::SimpleAtoi(AV(path), &db) || db < 0 || db > 100000) {
      return Bad(fmt::format("'/{}' is not a database number", path));
    }
    a.db = db;
  }
  return a;
}

std::optional<RemoteOptions> RemoteOptionsFromEnvironment(Env* env) {
  if (env == nullptr) env = PosixEnv();
  std::optional<std::string> url = env->GetVar("FUSEJIT_REMOTE_CACHE");
  if (!url.has_value()) return std::nullopt;
  const std::string trimmed(absl::StripAsciiWhitespace(AV(*url)));
  if (trimmed.empty()) return std::nullopt;
  absl::StatusOr<RedisAddress> address = ParseRedisUrl(trimmed);
  if (!address.ok()) {
    // The value may hold a password: it is not echoed.
    Warn(fmt::format("ignoring FUSEJIT_REMOTE_CACHE: {}; caching locally only",
                     ErrorText(address.status())));
    return std::nullopt;
  }
  RemoteOptions o;
  o.address = *std::move(address);
  ReadMs(env, "FUSEJIT_REMOTE_CACHE_CONNECT_TIMEOUT_MS", 1, &o.connect_timeout);
  ReadMs(env, "FUSEJIT_REMOTE_CACHE_TIMEOUT_MS", 1, &o.timeout);
  ReadMs(env, "FUSEJIT_REMOTE_CACHE_RETRY_MS", 0, &o.retry_interval);
  ReadMs(env, "FUSEJIT_REMOTE_CACHE_LOCK_TTL_MS", 10, &o.lock_ttl);
  if (std::optional<std::string> cap = env->GetVar("FUSEJIT_REMOTE_CACHE_MAX_VALUE_BYTES")) {
    std::optional<uint64_t> bytes = ParseByteSize(*cap);
    if (bytes.has_value() && *bytes > 0 && *bytes <= (uint64_t{512} << 20)) {
      o.max_value_bytes = *bytes;
    } else {
      Warn(fmt::format("ignoring FUSEJIT_REMOTE_CACHE_MAX_VALUE_BYTES='{}': expected bytes, or "
                       "a number with a K, M or G suffix, at most 512M; keeping {} bytes",
                       *cap, o.max_value_bytes));
    }
  }
  if (std::optional<std::string> ro = env->GetVar("FUSEJIT_REMOTE_CACHE_READONLY")) {
    o.read_only = IsTrue(*ro);
  }
  return o;
}

}  // namespace fusejit::cache
