// codegen/chain_info.h: facts about a valid chain that planning and emission both need.
#ifndef FUSEJIT_CODEGEN_CHAIN_INFO_H_
#define FUSEJIT_CODEGEN_CHAIN_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fusejit/chain.h"

namespace fusejit::codegen {

enum class MeanMode { kNone = 0, kSpatial = 1, kAll = 2 };  // values match fj::MeanMode

struct ChainInfo {
  const Op* producer = nullptr;    // the conv, if any
  const Op* group_norm = nullptr;  // the group_norm, if any
  int group_norm_index = -1;
  int producer_index = -1;
  MeanMode mean = MeanMode::kNone;
  std::vector<const Op*> pre_ops;   // elementwise ops before group_norm (all, without one)
  std::vector<const Op*> post_ops;  // elementwise ops after group_norm
  Shape producer_shape;             // [N,C,D,H,W] the elementwise ops and group_norm see
  int64_t elements = 0;             // NumElements(producer_shape)
  // Multiply-adds the producer does per output point (0 without a producer); for transposed
  // convolutions the average over output phases.
  double macs_per_point = 0;
  int64_t input_channels = 0;  // x's channels (the producer's input channels)
  std::string weight_param, bias_param, gamma_param, beta_param;  // "" when absent
  DType dtype = DType::kF32;  // of x, the parameters and y
};

// REQUIRES: chain is valid.
ChainInfo AnalyzeChain(const Chain& chain);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_CHAIN_INFO_H_
