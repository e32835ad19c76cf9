#include "codegen/chain_info.h"

#include "absl/strings/str_cat.h"

namespace fusejit::codegen {

ChainInfo AnalyzeChain(const Chain& chain) {
  ChainInfo info;
  info.dtype = chain.dtype;
  info.producer_shape = chain.input;
  for (size_t i = 0; i < chain.ops.size(); ++i) {
    const Op& op = chain.ops[i];
    if (IsProducer(op.kind)) {
      info.producer = &op;
      info.producer_index = static_cast<int>(i);
      info.producer_shape = ShapeAfter(chain, i);
      info.weight_param = absl::StrCat(i, ".weight");
      if (op.conv.bias) info.bias_param = absl::StrCat(i, ".bias");
      const ConvAttrs& c = op.conv;
      const double taps = static_cast<double>(c.kernel[0] * c.kernel[1] * c.kernel[2]);
      double macs = static_cast<double>(chain.input[1]) * taps;
      if (op.kind == OpKind::kConvTranspose3d) {
        macs /= static_cast<double>(c.stride[0] * c.stride[1] * c.stride[2]);
      }
      info.macs_per_point = macs;
    } else if (op.kind == OpKind::kGroupNorm) {
      info.group_norm = &op;
      info.group_norm_index = static_cast<int>(i);
      info.gamma_param = absl::StrCat(i, ".weight");
      info.beta_param = absl::StrCat(i, ".bias");
    } else if (op.kind == OpKind::kMean) {
      info.mean = op.dims.size() == 3 ? MeanMode::kSpatial : MeanMode::kAll;
    } else {
      (info.group_norm ? info.post_ops : info.pre_ops).push_back(&op);
    }
  }
  info.elements = NumElements(info.producer_shape);
  info.input_channels = chain.input[1];
  return info;
}

}  // namespace fusejit::codegen
