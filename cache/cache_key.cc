#include "cache/cache_key.h"

#include <xxhash.h>

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "cache/entry_format.h"

namespace fusejit::cache {
namespace {

// Streams length-prefixed fields into XXH3-128, so that ("ab", "c") and ("a", "bc") differ.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState(), &XXH3_freeState) {
    // XXH3_createState only fails when malloc does; then abort like operator new would.
    if (state_ == nullptr || XXH3_128bits_reset(state_.get()) != XXH_OK) std::abort();
  }
  void Field(std::string_view bytes) {
    uint8_t len[8];
    const uint64_t n = bytes.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    XXH3_128bits_update(state_.get(), len, sizeof(len));
    XXH3_128bits_update(state_.get(), bytes.data(), bytes.size());
  }
  std::string Hex() const { return CanonicalHex(XXH3_128bits_digest(state_.get())); }

  static std::string CanonicalHex(XXH128_hash_t hash) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, hash);
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string hex(32, '0');
    for (int i = 0; i < 16; ++i) {
      hex[2 * i] = kDigits[canonical.digest[i] >> 4];
      hex[2 * i + 1] = kDigits[canonical.digest[i] & 15];
    }
    return hex;
  }

 private:
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

}  // namespace

std::string CacheKey::EntryName() const {
  Hasher h;
  h.Field("fusejit kernel cache key v1");
  h.Field(source_hash);
  h.Field(generator_version);
  h.Field(nvrtc_version);
  h.Field(options);
  h.Field(arch);
  return h.Hex() + std::string(kEntrySuffix);
}

bool CacheKey::SameEntryAs(const CacheKey& other) const {
  return source_hash == other.source_hash && generator_version == other.generator_version &&
         nvrtc_version == other.nvrtc_version && options == other.options && arch == other.arch;
}

std::string HashSource(std::string_view main_source, absl::Span<const std::string_view> headers) {
  Hasher h;
  h.Field(main_source);
  for (std::string_view header : headers) h.Field(header);
  return h.Hex();
}

std::string HashSource(std::string_view main_source, const std::vector<std::string>& headers) {
  std::vector<std::string_view> views(headers.begin(), headers.end());
  return HashSource(main_source, absl::MakeConstSpan(views));
}

std::string HashBytesHex(std::string_view bytes) {
  return Hasher::CanonicalHex(XXH3_128bits(bytes.data(), bytes.size()));
}

}  // namespace fusejit::cache
