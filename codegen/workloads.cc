#include "fusejit/workloads.h"

namespace fusejit {

const std::vector<Workload>& SeedWorkloads() {
  static const auto* list = new std::vector<Workload>{
      {"W1",
       "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
       "group_norm(groups=4,eps=1e-5) | hardswish",
       "convT + swish + group_norm + hardswish"},
      {"W2",
       "x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | "
       "mean(dims=[2,3,4])",
       "conv + hardswish + group_norm + mean"},
      {"W3",
       "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
       "group_norm(groups=8,eps=1e-5)",
       "convT (64->128) + relu + group_norm"},
      {"W4",
       "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | "
       "mean(dims=[1,2,3,4])",
       "conv + group_norm + mean"},
  };
  return *list;
}

}  // namespace fusejit
