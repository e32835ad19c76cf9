// libFuzzer target: the tuning database's record decoder (and TuneConfig::Parse of the
// configuration it holds, as TuningDb::Find does). Properties: no crash or UB; a record that
// decodes encodes to a record that decodes to the same fields (times are written with 6 decimals,
// so they are compared after one round trip).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "codegen/tune_config.h"
#include "tune/tuning_db.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<fusejit::tune::TuningRecord> r = fusejit::tune::TuningRecord::Decode(text);
  if (!r.ok()) return 0;
  (void)fusejit::codegen::TuneConfig::Parse(r->config);
  const std::string once = r->Encode();
  absl::StatusOr<fusejit::tune::TuningRecord> again = fusejit::tune::TuningRecord::Decode(once);
  if (!again.ok()) {
    std::fprintf(stderr, "tuning record fuzzer: an encoded record does not decode: %s\n%s\n",
                 std::string(again.status().message()).c_str(), once.c_str());
    std::abort();
  }
  if (again->Encode() != once || again->key.spec != r->key.spec || again->config != r->config ||
      again->tried != r->tried || again->key.device.sm_count != r->key.device.sm_count) {
    std::fprintf(stderr, "tuning record fuzzer: round trip changed the record:\n%s\n", once.c_str());
    std::abort();
  }
  return 0;
}
