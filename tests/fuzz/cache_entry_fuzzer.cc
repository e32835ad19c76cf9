// libFuzzer target: the kernel cache's entry decoder. The first byte chooses a mode: odd, the
// rest of the input gets a correct checksum first (so mutations reach the length and header
// parsers behind it); even, it is decoded as is. Properties: no crash or UB; an entry that decodes
// re-encodes to an entry that decodes to the same key and payload.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cache/entry_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) != 0 && bytes.size() >= 16) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size() - 16));
    bytes.replace(bytes.size() - 16, 16, reinterpret_cast<const char*>(canonical.digest), 16);
  }
  absl::StatusOr<fusejit::cache::DecodedEntry> e = fusejit::cache::DecodeEntry(bytes);
  if (!e.ok()) return 0;
  const std::string encoded = fusejit::cache::EncodeEntry(e->key, e->payload);
  absl::StatusOr<fusejit::cache::DecodedEntry> again = fusejit::cache::DecodeEntry(encoded);
  if (!again.ok() || !(again->key == e->key) || again->payload != e->payload) {
    std::fprintf(stderr, "cache entry fuzzer: a decoded entry does not round-trip (%s)\n",
                 again.ok() ? "different key or payload" : std::string(again.status().message()).c_str());
    std::abort();
  }
  return 0;
}
