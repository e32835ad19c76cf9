#include "codegen/tap_gemm_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/backward_plan.h"
#include "codegen/chain_info.h"
#include "codegen/strategy_util.h"

namespace fusejit::codegen {
namespace {

std::optional<TapGemm> NotApplicable(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return std::nullopt;
}

int64_t Taps(const ConvAttrs& conv) { return conv.kernel[0] * conv.kernel[1] * conv.kernel[2]; }

bool Transposed(const Chain& chain) { return chain.ops[0].kind == OpKind::kConvTranspose3d; }

}  // namespace

std::optional<TapGemm> SplitTapGemm(const Chain& chain, std::string* why) {
  if (chain.dtype != DType::kF32) {
    return NotApplicable(why, "tap-gemm runs f32 chains (bf16/f16 run it through their f32 plan)");
  }
  const ChainInfo info = AnalyzeChain(chain);
  if (info.producer == nullptr) return NotApplicable(why, "tap-gemm needs a convolution");
  const ConvAttrs& conv = info.producer->conv;
  const int64_t taps = Taps(conv);
  if (taps < 2) return NotApplicable(why, "a 1x1x1 convolution is a GEMM already");
  if (info.input_channels < 8) {
    return NotApplicable(why, "tap-gemm needs at least 8 input channels (fewer: the few-in plans)");
  }
  const Shape& in = chain.input;
  const int64_t z_elements = in[0] * conv.out_channels * taps * in[2] * in[3] * in[4];
  constexpr int64_t kMaxZBytes = int64_t{2} << 30;
  if (z_elements > ChainLimits::kMaxElements || z_elements * 4 > kMaxZBytes) {
    return NotApplicable(why,
                         absl::StrCat("Z (", z_elements, " floats: N x C x taps x input points)",
                                      " is over 2^31 elements or 2 GiB"));
  }
  TapGemm split;
  split.taps = taps;
  split.reuse = static_cast<double>(taps) /
                static_cast<double>(conv.stride[0] * conv.stride[1] * conv.stride[2]);
  split.gemm.input = chain.input;
  split.gemm.dtype = DType::kF32;
  split.gemm.ops = {Conv3d(conv.out_channels * taps, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1},
                           /*bias=*/false)};
  if (absl::Status s = ValidateChain(split.gemm); !s.ok()) {
    return NotApplicable(why, absl::StrCat("its GEMM chain is not valid: ", s.message()));
  }
  split.rest = TailChain(chain);
  split.weight_bytes = static_cast<size_t>(conv.out_channels * taps * info.input_channels) * 4;
  split.z_bytes = static_cast<size_t>(z_elements) * 4;
  split.conv_bytes = static_cast<size_t>(info.elements) * 4;
  return split;
}

double TapGemmCost(const Chain& chain, const TapGemm& split, const PlanTarget& target) {
  // Z entries the gather reads: every tap of every output (a transposed convolution's output
  // reads 1 / stride^3 of its taps on average: `reuse` a point), from L2 mostly; Z itself once
  // from memory. The convolution's output is f32: conv_bytes / 4 values.
  const double outputs = static_cast<double>(split.conv_bytes / 4);
  const double reads =
      outputs * (Transposed(chain) ? split.reuse : static_cast<double>(split.taps));
  const double dram = std::min(static_cast<double>(split.z_bytes), reads * 4.0);
  constexpr double kDramBytesPerMicro = 3e6, kL2BytesPerMicro = 10e6, kMicrosPerKernel = 3.0;
  const double gather_us = dram / kDramBytesPerMicro + reads * 4.0 / kL2BytesPerMicro +
                           static_cast<double>(split.conv_bytes) / kDramBytesPerMicro +
                           kMicrosPerKernel;
  const double weight_us = kMicrosPerKernel;
  double cost = LowestCost(split.gemm, target) + (gather_us + weight_us) * 1e6;
  if (!split.rest.ops.empty()) cost += LowestCost(split.rest, target);
  return cost;
}

std::optional<std::string> TapGemmBeatsOwnPlan(const Chain& chain, const TapGemm& split,
                                               const PlanTarget& target,
                                               std::string_view own_strategy, double own_cost) {
  // Below 2 reads an input value, the split only adds Z's round trip (a conv_transpose3d with
  // k=2, stride=2: 0.78-0.94x measured, H200, session 30).
  if (split.reuse < 2) return std::nullopt;
  const double tap = TapGemmCost(chain, split, target);
  // With few output channels (<= 8) and 16+ input channels the models favor the chain's own plan
  // (tc-conv's padded 8-wide tiles, direct-few-out, conv-moments-mean) by more than they should:
  // of 17 such chains forced both ways in fp32 and TF32 (34 pairs, H200, session 30 run 5), every
  // pair with own / tap-gemm modeled above 0.62 ran faster as tap-gemm (1.16-2.87x), every one
  // slower (0.25-0.90x) was modeled below 0.61.
  const bool few_out = chain.ops[0].conv.out_channels <= 8 && chain.input[1] >= 16;
  constexpr double kFewOutDiscount = 1.6;
  if (!(tap < own_cost * (few_out ? kFewOutDiscount : 1.0))) return std::nullopt;
  return absl::StrCat("model us ", CostMicros(tap), ", below the chain's own plan's (",
                      std::string(own_strategy), ", ", CostMicros(own_cost), ")",
                      few_out ? " x 1.6 (few output channels)" : "");
}

Plan PlanTapWeight(const Chain& chain, const TapGemm& split, const std::string& from,
                   const std::string& to, const PlanTarget& target) {
  const ConvAttrs& conv = chain.ops[0].conv;
  const int64_t cin = chain.input[1], c = conv.out_channels;
  const Shape w = ChainParams(chain)[0].shape;
  Plan plan;
  plan.strategy = std::string(kTapGemmStrategy);
  plan.description = "the convolution's weight as the GEMM's: [C x taps][Cin]";
  plan.includes = {"tap_gemm.cuh"};
  plan.signature.push_back({from, TensorRole::kInput, DType::kF32, w, 16});
  plan.signature.push_back(
      {to, TensorRole::kOutput, DType::kF32, {c * split.taps, cin, 1, 1, 1}, 16});
  KernelLaunch k;
  k.symbol = "fj_tap_weight";
  k.body = absl::StrCat("fj::tap_weight_kernel<", c, ", ", cin, ", ", split.taps, ", ",
                        Transposed(chain) ? "true" : "false", ">");
  k.purpose = absl::StrCat(from, " ", FormatShape(w), " -> ", to, " [", c * split.taps, "][", cin,
                           "] (tap-major rows)");
  k.grid = {GridStrideBlocks(c * split.taps * cin, target), 1, 1};
  k.block = {256, 1, 1};
  k.args = {KernelArg::Tensor("w", from, KernelArg::Access::kRead),
            KernelArg::Tensor("wt", to, KernelArg::Access::kWrite)};
  plan.kernels.push_back(std::move(k));
  return plan;
}

Plan PlanTapGather(const Chain& chain, const TapGemm& split, const std::string& z,
                   const std::string& bias, const std::string& to, const PlanTarget& target) {
  const ConvAttrs& conv = chain.ops[0].conv;
  const Shape& in = chain.input;
  const Shape out = ShapeAfter(chain, 0);
  const int64_t c = conv.out_channels;
  Plan plan;
  plan.strategy = std::string(kTapGemmStrategy);
  plan.description = "each output of the convolution: its taps' entries of Z summed, in tap order";
  plan.includes = {"tap_gemm.cuh"};
  plan.signature.push_back(
      {z, TensorRole::kInput, DType::kF32, {in[0], c * split.taps, in[2], in[3], in[4]}, 16});
  if (conv.bias) plan.signature.push_back({bias, TensorRole::kInput, DType::kF32, {c}, 16});
  plan.signature.push_back({to, TensorRole::kOutput, DType::kF32, out, 16});
  KernelLaunch k;
  k.symbol = "fj_tap_gather";
  const auto& s = conv.stride;
  const auto& p = conv.padding;
  const auto& l = conv.dilation;
  const auto& kk = conv.kernel;
  k.body = absl::StrCat(
      "fj::tap_gather_kernel<", Transposed(chain) ? "true" : "false", ", ", out[0] * out[1], "LL, ",
      c, ", ", in[2], ", ", in[3], ", ", in[4], ", ", out[2], ", ", out[3], ", ", out[4], ", ",
      kk[0], ", ", kk[1], ", ", kk[2], ", ", s[0], ", ", s[1], ", ", s[2], ", ", p[0], ", ", p[1],
      ", ", p[2], ", ", l[0], ", ", l[1], ", ", l[2], ", ", conv.bias ? "true" : "false", ">");
  k.purpose = absl::StrCat(to, " ", FormatShape(out), " from ", z, " (", split.taps,
                           " taps an output, summed in order)", conv.bias ? " + bias" : "");
  k.grid = {GridStrideBlocks(NumElements(out), target), 1, 1};
  k.block = {256, 1, 1};
  k.args = {KernelArg::Tensor("z", z, KernelArg::Access::kRead),
            conv.bias ? KernelArg::Tensor("bias", bias, KernelArg::Access::kRead)
                      : KernelArg::Null(ArgType::kFloat, "bias", KernelArg::Access::kRead),
            KernelArg::Tensor("y", to, KernelArg::Access::kWrite)};
  plan.kernels.push_back(std::move(k));
  return plan;
}

}  // namespace fusejit::codegen
