// cache/cache_key.h: what identifies a cached kernel, and the hashes that name it.
#ifndef FUSEJIT_CACHE_CACHE_KEY_H_
#define FUSEJIT_CACHE_CACHE_KEY_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace fusejit::cache {

// Everything that decides a cubin's bits. Two keys that differ in any field but `spec` name
// different entries; `spec` is informational (shown by `fusejit cache list`).
struct CacheKey {
  std::string source_hash;        // HashSource() of the generated source and every header
  std::string generator_version;  // fusejit::GeneratorVersion()
  std::string nvrtc_version;      // e.g. "13.0"
  std::string options;            // NVRTC options, joined in the order passed to NVRTC
  std::string arch;               // "sm_90"
  std::string spec;               // canonical chain spec; not part of the entry name

  // The entry's file name: 32 lowercase hex digits of XXH3-128 over every field but `spec`
  // (length-prefixed, so fields cannot run into each other), then ".fjk". Stable across
  // processes, machines and fusejit builds of the same cache format version.
  std::string EntryName() const;

  // Equality of the fields that EntryName() hashes.
  bool SameEntryAs(const CacheKey& other) const;

  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// XXH3-128, 32 lowercase hex digits, of the main source followed by each header text in order
// (each length-prefixed). Deterministic across processes: no seeds, no pointers.
std::string HashSource(std::string_view main_source,
                       absl::Span<const std::string_view> headers = {});
std::string HashSource(std::string_view main_source, const std::vector<std::string>& headers);

// XXH3-128 of bytes as 32 lowercase hex digits.
std::string HashBytesHex(std::string_view bytes);

}  // namespace fusejit::cache

#endif  // FUSEJIT_CACHE_CACHE_KEY_H_
