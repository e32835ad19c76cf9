// libFuzzer target: the prewarm manifest reader (grids, comments, locations). Properties: no
// crash or UB; the counts agree (every spec named is an entry, a duplicate or invalid); every
// error is located "fuzz.txt:LINE..."; every entry's spec is canonical.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tools/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fusejit::tools::ManifestOptions options;
  options.max_specs = 256;  // bounds the work of one input (grids multiply)
  absl::StatusOr<fusejit::tools::Manifest> m = fusejit::tools::ParseManifest(text, "fuzz.txt", options);
  if (!m.ok()) return 0;
  if (m->entries.size() + m->duplicates + m->invalid_specs != m->specs) {
    std::fprintf(stderr, "manifest fuzzer: %zu entries + %zu duplicates + %zu invalid != %zu specs\n",
                 m->entries.size(), m->duplicates, m->invalid_specs, m->specs);
    std::abort();
  }
  for (const std::string& e : m->errors) {
    if (e.rfind("fuzz.txt:", 0) != 0) {
      std::fprintf(stderr, "manifest fuzzer: unlocated error: %s\n", e.c_str());
      std::abort();
    }
  }
  for (const fusejit::tools::ManifestEntry& e : m->entries) {
    if (fusejit::FormatChain(e.chain) != e.spec) {
      std::fprintf(stderr, "manifest fuzzer: entry spec is not canonical: %s\n", e.spec.c_str());
      std::abort();
    }
  }
  return 0;
}
