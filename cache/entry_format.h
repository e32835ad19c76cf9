// cache/entry_format.h: the bytes of one cache entry file.
//
//   offset       size  field
//   0            8     magic "FJKCACHE"
//   8            4     format version, little-endian (kFormatVersion)
//   12           4     header length H, little-endian
//   16           H     header: readable text, one "name: value" line per key field (values
//                      escaped C-style), see EncodeEntry()
//   16+H         8     payload length N, little-endian
//   24+H         N     payload (the cubin)
//   24+H+N       16    XXH3-128 (canonical, big-endian) of bytes [0, 24+H+N)
//
// The file is exactly 40+H+N bytes; anything else is corrupt. The header repeats the whole key, so
// an entry copied to another key's name is rejected, and `head -c 300 entry` shows what it is.
#ifndef FUSEJIT_CACHE_ENTRY_FORMAT_H_
#define FUSEJIT_CACHE_ENTRY_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/cache_key.h"

namespace fusejit::cache {

inline constexpr std::string_view kEntryMagic = "FJKCACHE";
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr std::string_view kEntrySuffix = ".fjk";
// Bytes of an entry besides its header text and payload.
inline constexpr uint64_t kEntryOverhead = 8 + 4 + 4 + 8 + 16;

std::string EncodeEntry(const CacheKey& key, std::string_view payload);

struct DecodedEntry {
  CacheKey key;  // as written in the header
  std::string payload;
};

// Checks size, magic, version, lengths and checksum, then parses the header. Fails with
// kDataLoss naming what is wrong. Does not compare the key: see CheckKey().
absl::StatusOr<DecodedEntry> DecodeEntry(std::string_view bytes);

// OK when `found` (from a header) is the entry `expected` asks for (all fields but spec);
// otherwise kDataLoss naming the first field that differs.
absl::Status CheckKey(const CacheKey& expected, const CacheKey& found);

// True for names EntryName() produces: 32 lowercase hex digits + kEntrySuffix.
bool IsEntryFileName(std::string_view name);

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_ENTRY_FORMAT_H_
