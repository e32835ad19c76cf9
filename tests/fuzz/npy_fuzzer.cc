// libFuzzer target: the .npy reader (header dict parser, versions, lengths, shapes). Properties: no
// crash or UB; an accepted file holds exactly product(shape) float32 values after its header.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "reference/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fusejit::HostTensor> t = fusejit::ParseNpy(bytes, "fuzz.npy");
  if (!t.ok()) return 0;
  uint64_t elements = 1;
  for (int64_t d : t->shape) {
    if (d < 0) std::abort();
    elements *= static_cast<uint64_t>(d);
  }
  if (elements != t->data.size() || t->data.size() * sizeof(float) > size) {
    std::fprintf(stderr, "npy fuzzer: %zu values for %llu elements in %zu bytes\n",
                 t->data.size(), static_cast<unsigned long long>(elements), size);
    std::abort();
  }
  return 0;
}
