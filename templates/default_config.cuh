// templates/default_config.cuh: the chain configuration every template reads, with default
// values so that each template compiles on its own (tests compile every template through NVRTC
// with this file). A generated source defines its own struct with the same fields, baked for its
// chain (codegen/cfg_fields.h lists them once; tests/codegen/cfg_fields_test.cc checks this struct
// against that list field by field: add a field there and here together).
//
// Tensors: input x [kN, kCin, kDin, kHin, kWin]; the producer's output -- the tensor that the
// elementwise ops and group_norm see -- is [kN, kC, kD, kH, kW]. With no producer, kC == kCin etc.
#ifndef FUSEJIT_TEMPLATES_DEFAULT_CONFIG_CUH_
#define FUSEJIT_TEMPLATES_DEFAULT_CONFIG_CUH_

#include "common.cuh"

namespace fj {

enum Producer { kNoProducer = 0, kConv3d = 1, kConvTranspose3d = 2 };
enum MeanMode { kNoMean = 0, kMeanSpatial = 1 /* dims [2,3,4] -> [N,C] */, kMeanAll = 2 /* [1,2,3,4] -> [N] */ };

struct DefaultConfig {
  static constexpr int kN = 2;
  static constexpr int kCin = 3, kDin = 8, kHin = 10, kWin = 12;
  static constexpr int kC = 8, kD = 6, kH = 8, kW = 10;
  // Producer (conv3d here): kernel, stride, padding, dilation, output_padding per (d, h, w).
  static constexpr int kProducer = kConv3d;
  static constexpr int kKD = 3, kKH = 3, kKW = 3;
  static constexpr int kSD = 1, kSH = 1, kSW = 1;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
  static constexpr int kDilD = 1, kDilH = 1, kDilW = 1;
  static constexpr int kOPD = 0, kOPH = 0, kOPW = 0;
  static constexpr bool kBias = true;
  // group_norm: kGroups == 0 when the chain has none.
  static constexpr int kGroups = 4;
  static constexpr float kEps = 1e-5f;
  static constexpr int kMean = kNoMean;
  // Elementwise ops before group_norm (all of them when there is no group_norm) and after it.
  __device__ static float pre(float v) { return fj::swish(v); }
  __device__ static float post(float v) { return fj::hardswish(v); }
  // The same ops with the product of their derivatives in d (generated only for backward plans).
  __device__ static float pre_d(float v, float& d) {
    d = fj::swish_d(v);
    return fj::swish(v);
  }
  __device__ static float post_d(float v, float& d) {
    d = fj::hardswish_d(v);
    return fj::hardswish(v);
  }
};

}  // namespace fj

#endif  // FUSEJIT_TEMPLATES_DEFAULT_CONFIG_CUH_
