// tools/tensor_files.h: the --input / --param NAME=FILE.npy flags shared by `run` and `bench`.
#ifndef FUSEJIT_TOOLS_TENSOR_FILES_H_
#define FUSEJIT_TOOLS_TENSOR_FILES_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "fusejit/chain.h"
#include "fusejit/reference.h"
#include "tools/args.h"

namespace fusejit::tools {

// The tensors named on the command line: "x" for --input, parameter names for --param.
struct TensorFiles {
  std::map<std::string, std::string> files;  // name -> path
};

// Parses --input and every --param NAME=FILE against the chain's parameter names (usage errors:
// malformed value, unknown name, a name given twice).
absl::StatusOr<TensorFiles> ParseTensorFlags(const ParsedArgs& parsed, const Chain& chain);

// Reads the named files (float32 .npy) into `inputs`, checking each shape against the chain's;
// for a bf16/f16 chain each value is rounded to the chain's dtype (nearest even).
absl::Status ReadTensorFiles(const TensorFiles& files, const Chain& chain, HostInputs& inputs);

// RandomInputs(chain, seed) with every tensor of `given` (from ReadTensorFiles) in its place.
HostInputs InputsWith(const Chain& chain, uint64_t seed, HostInputs given);

// A random upstream gradient grad_y for the chain's output (for a bf16/f16 chain rounded to its
// dtype): uniform in [-1, 1), from its own
// std::mt19937_64 stream seeded with seed ^ 0x677261645f79 ("grad_y"), (r >> 11) * 2^-52 - 1 per
// value in C order.
HostTensor RandomGradOutput(const Chain& chain, uint64_t seed);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_TENSOR_FILES_H_
