#include "cache/entry_format.h"

#include <xxhash.h>

#include <array>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace fusejit::cache {
namespace {

constexpr std::string_view kHeaderTitle = "fusejit kernel cache entry";
constexpr size_t kMaxHeaderBytes = 1 << 20;

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(std::string_view in, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<uint8_t>(in[offset + i])} << (8 * i);
  }
  return v;
}

std::array<char, 16> Checksum(std::string_view bytes) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size()));
  std::array<char, 16> out;
  std::memcpy(out.data(), canonical.digest, 16);
  return out;
}

// C-style escaping so that every value stays on one readable line.
std::string Escape(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += fmt::format("\\x{:02x}", u);
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

absl::StatusOr<std::string> Unescape(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '\\') {
      out.push_back(value[i]);
      continue;
    }
    if (i + 1 >= value.size()) return absl::DataLossError("header: dangling '\\'");
    const char e = value[++i];
    switch (e) {
      case '\\':
        out.push_back('\\');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'x': {
        if (i + 2 >= value.size()) return absl::DataLossError("header: truncated \\x escape");
        int byte = 0;
        for (int k = 1; k <= 2; ++k) {
          const char h = value[i + k];
          int d;
          if (h >= '0' && h <= '9') {
            d = h - '0';
          } else if (h >= 'a' && h <= 'f') {
            d = h - 'a' + 10;
          } else {
            return absl::DataLossError("header: bad \\x escape");
          }
          byte = byte * 16 + d;
        }
        out.push_back(static_cast<char>(byte));
        i += 2;
        break;
      }
      default:
        return absl::DataLossError(fmt::format("header: unknown escape '\\{}'", e));
    }
  }
  return out;
}

struct Field {
  std::string_view name;
  std::string CacheKey::*member;
};
constexpr Field kFields[] = {
    {"source_hash", &CacheKey::source_hash},
    {"generator_version", &CacheKey::generator_version},
    {"nvrtc_version", &CacheKey::nvrtc_version},
    {"options", &CacheKey::options},
    {"arch", &CacheKey::arch},
    {"spec", &CacheKey::spec},
};

std::string EncodeHeader(const CacheKey& key, uint64_t payload_bytes) {
  std::string header = std::string(kHeaderTitle) + "\n";
  for (const Field& f : kFields) {
    header += fmt::format("{}: {}\n", f.name, Escape(key.*f.member));
  }
  header += fmt::format("payload_bytes: {}\n", payload_bytes);
  return header;
}

absl::StatusOr<CacheKey> DecodeHeader(std::string_view header, uint64_t payload_bytes) {
  std::vector<std::string_view> lines;
  for (size_t start = 0;;) {
    const size_t end = header.find('\n', start);
    lines.push_back(header.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  constexpr size_t kFieldCount = sizeof(kFields) / sizeof(kFields[0]);
  // Title, fields, payload_bytes, and the empty string after the last newline.
  if (lines.size() != kFieldCount + 3 || !lines.back().empty()) {
    return absl::DataLossError(
        fmt::format("header: {} lines, expected {}", lines.size() - 1, kFieldCount + 2));
  }
  if (lines[0] != kHeaderTitle) return absl::DataLossError("header: bad title line");
  CacheKey key;
  for (size_t i = 0; i < kFieldCount; ++i) {
    const std::string prefix = fmt::format("{}: ", kFields[i].name);
    if (lines[i + 1].substr(0, prefix.size()) != prefix) {
      return absl::DataLossError(
          fmt::format("header: line {} is not '{}'", i + 2, kFields[i].name));
    }
    absl::StatusOr<std::string> value = Unescape(lines[i + 1].substr(prefix.size()));
    if (!value.ok()) return value.status();
    key.*kFields[i].member = *std::move(value);
  }
  if (lines[kFieldCount + 1] != fmt::format("payload_bytes: {}", payload_bytes)) {
    return absl::DataLossError("header: payload_bytes does not match the payload length");
  }
  return key;
}

}  // namespace

std::string EncodeEntry(const CacheKey& key, std::string_view payload) {
  const std::string header = EncodeHeader(key, payload.size());
  std::string out;
  out.reserve(kEntryOverhead + header.size() + payload.size());
  out.append(kEntryMagic);
  PutLe(out, kFormatVersion, 4);
  PutLe(out, header.size(), 4);
  out.append(header);
  PutLe(out, payload.size(), 8);
  out.append(payload);
  const std::array<char, 16> sum = Checksum(out);
  out.append(sum.data(), sum.size());
  return out;
}

absl::StatusOr<DecodedEntry> DecodeEntry(std::string_view bytes) {
  if (bytes.size() < kEntryOverhead) {
    return absl::DataLossError(
        fmt::format("truncated: {} bytes, an entry has at least {}", bytes.size(), kEntryOverhead));
  }
  if (bytes.substr(0, kEntryMagic.size()) != kEntryMagic) {
    return absl::DataLossError("bad magic: not a fusejit cache entry");
  }
  const uint64_t version = GetLe(bytes, 8, 4);
  if (version != kFormatVersion) {
    return absl::DataLossError(
        fmt::format("format version {}, this build reads version {}", version, kFormatVersion));
  }
  const uint64_t header_len = GetLe(bytes, 12, 4);
  if (header_len > kMaxHeaderBytes || 16 + header_len + 8 + 16 > bytes.size()) {
    return absl::DataLossError(
        fmt::format("header length {} does not fit a {}-byte file", header_len, bytes.size()));
  }
  const uint64_t payload_len = GetLe(bytes, 16 + header_len, 8);
  const uint64_t expected_size = kEntryOverhead + header_len + payload_len;
  if (payload_len > bytes.size() || expected_size != bytes.size()) {
    return absl::DataLossError(fmt::format("size {} bytes, header and payload lengths say {}",
                                           bytes.size(), expected_size));
  }
  const size_t body = bytes.size() - 16;
  const std::array<char, 16> sum = Checksum(bytes.substr(0, body));
  if (std::memcmp(sum.data(), bytes.data() + body, 16) != 0) {
    return absl::DataLossError("checksum mismatch");
  }
  absl::StatusOr<CacheKey> key = DecodeHeader(bytes.substr(16, header_len), payload_len);
  if (!key.ok()) return key.status();
  DecodedEntry entry;
  entry.key = *std::move(key);
  entry.payload.assign(bytes.substr(24 + header_len, payload_len));
  return entry;
}

absl::Status CheckKey(const CacheKey& expected, const CacheKey& found) {
  for (const Field& f : kFields) {
    if (&CacheKey::spec == f.member) continue;
    if (expected.*f.member != found.*f.member) {
      return absl::DataLossError(
          fmt::format("entry belongs to another key: {} is '{}', expected '{}'", f.name,
                      Escape(found.*f.member), Escape(expected.*f.member)));
    }
  }
  return absl::OkStatus();
}

bool IsEntryFileName(std::string_view name) {
  if (name.size() != 32 + kEntrySuffix.size()) return false;
  if (name.substr(32) != kEntrySuffix) return false;
  for (char c : name.substr(0, 32)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace fusejit::cache
