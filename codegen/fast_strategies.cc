// The fast strategies for chains with a cheap producer (few input channels): register-tiled
// direct convolutions that never store a full-size intermediate. Each lives in its own file:
//   conv-moments-mean          conv_moments_strategy.cc
//   mma-moments-mean           mma_moments_strategy.cc
//   mma-direct                 mma_moments_strategy.cc (conv3d | ew*: one pass)
//   convt-recompute-normalize  convt_strategy.cc
//   convt-store-normalize      convt_strategy.cc
//   convt-direct               convt_strategy.cc (conv_transpose3d | ew*: one pass)
//   mma-convt-recompute-normalize, mma-convt-direct  mma_convt_strategy.cc (the same on tensor
//   cores) direct-few-out             direct_few_out_strategy.cc channel-moments-mean
//   channel_moments_strategy.cc (no producer: group_norm | mean) slice-normalize
//   slice_normalize_strategy.cc (no producer: a group slice on chip)
#include "codegen/fast_strategies.h"

namespace fusejit::codegen {

void AddFastStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(MakeConvMomentsMeanStrategy());
  out->push_back(MakeMmaMomentsMeanStrategy());
  out->push_back(MakeMmaDirectStrategy());
  out->push_back(MakeConvTRecomputeStrategy());
  out->push_back(MakeConvTStoreStrategy());
  out->push_back(MakeConvTDirectStrategy());
  out->push_back(MakeMmaConvTRecomputeStrategy());
  out->push_back(MakeMmaConvTDirectStrategy());
  out->push_back(MakeDirectFewOutStrategy());
  out->push_back(MakeChannelMomentsMeanStrategy());
  out->push_back(MakeSliceNormalizeStrategy());
}

}  // namespace fusejit::codegen
