// Fast strategies for chains with a cheap producer (few input channels): direct convolution with
// each thread computing a tile of outputs for all channels in registers, weights in shared memory,
// nothing full-size stored.
//   conv-moments-mean          conv3d | ew* | group_norm | mean       (seeds W2, W4)
//       templates/direct_conv_moments.cuh + moments_mean.cuh: the mean of an affine group_norm
//       output is gamma_c (m_c - mu_g) rstd_g + beta_c, so per-channel moments suffice.
//   convt-recompute-normalize  conv_transpose3d | ew* | group_norm | ew*   (seed W1)
//       templates/convt_group_norm.cuh: statistics pass recomputing the transposed convolution by
//       output phase without writing, then a pass recomputing it, normalizing and writing once.
// Launch shapes are heuristics measured on the H100 (bench/explore/NOTES.md); the autotuner
// refines them.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"

namespace fusejit::codegen {
namespace {

using Kind = KernelArg::Kind;
constexpr int64_t kStaticSharedLimit = 48 * 1024;

int64_t Round4(int64_t v) { return (v + 3) / 4 * 4; }

KernelArg Arg(Kind kind, std::string type, std::string name, std::string param = "",
              size_t offset = 0) {
  return {kind, std::move(type), std::move(name), std::move(param), offset};
}

TuneStruct::Field Int(std::string name, int64_t v) { return {"int", std::move(name), absl::StrCat(v)}; }
TuneStruct::Field Bool(std::string name, bool v) { return {"bool", std::move(name), v ? "true" : "false"}; }

// Conditions both strategies share: a biased producer of the given kind, a group_norm, at most 32
// channels (per-lane channel registers), and a producer cheap enough to recompute per point.
bool CheapProducerWithNorm(const ChainInfo& info, OpKind kind) {
  return info.producer && info.producer->kind == kind && info.producer->conv.bias &&
         info.group_norm && info.producer_shape[1] <= 32 && info.macs_per_point <= 256;
}

// ---- conv-moments-mean ----------------------------------------------------------------------

struct ConvMomentsTune {
  int threads = 128, min_blocks = 2, ph = 1, pw = 6, blocks_per_sample = 1;
};

ConvMomentsTune ChooseConvMomentsTune(const ChainInfo& info, const PlanTarget& target) {
  ConvMomentsTune t;
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  t.min_blocks = c <= 16 ? 3 : 2;
  t.pw = c <= 24 ? 6 : 4;
  t.pw = static_cast<int>(std::min<int64_t>(t.pw, info.producer_shape[4]));
  const int64_t tiles = info.producer_shape[2] * info.producer_shape[3] *
                        ((info.producer_shape[4] + t.pw - 1) / t.pw);
  const int64_t want = (static_cast<int64_t>(target.sm_count) * t.min_blocks + n / 2) / n;
  t.blocks_per_sample = static_cast<int>(
      std::clamp<int64_t>(want, 1, std::max<int64_t>(1, tiles / t.threads)));
  return t;
}

// Static shared memory of conv_moments (direct_conv_moments.cuh's DirectConvGeom).
int64_t ConvMomentsSharedBytes(const Chain& chain, const ChainInfo& info,
                               const ConvMomentsTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t c = info.producer_shape[1], cp = Round4(c);
  const int64_t smem_w = chain.input[1] * conv.kernel[0] * conv.kernel[1] * conv.kernel[2] * cp + cp;
  const int64_t scratch = (t.threads / 32) * (2 * c + 1);
  const int64_t wc = (t.pw - 1) * conv.stride[2] + (conv.kernel[2] - 1) * conv.dilation[2] + 1;
  const int64_t wcp = Round4(wc);
  const int64_t xbuf = (2 * wcp / 4) % 2 == 1 ? 2 * wcp : 2 * wcp + 4;
  return 4 * (smem_w + scratch + (2 * c + xbuf) * t.threads);
}

class ConvMomentsMeanStrategy : public Strategy {
 public:
  std::string_view name() const override { return "conv-moments-mean"; }
  bool Applies(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    if (!CheapProducerWithNorm(info, OpKind::kConv3d) || info.mean == MeanMode::kNone ||
        !info.post_ops.empty()) {
      return false;
    }
    return ConvMomentsSharedBytes(chain, info, ChooseConvMomentsTune(info, target)) <=
           kStaticSharedLimit;
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * 2.0 * info.macs_per_point / 50.0;
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    const ConvMomentsTune t = ChooseConvMomentsTune(info, target);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "direct conv3d, a tile of outputs for all channels per thread, weights in shared memory; "
        "per-block per-channel moments of the pre-norm values; the mean of the affine group_norm "
        "output follows from them (gamma_c (m_c - mu_g) rstd_g + beta_c): nothing full-size stored";
    plan.includes = {"direct_conv_moments.cuh", "moments_mean.cuh"};
    plan.tunes.push_back({"ConvMomentsTune",
                          {Int("kThreads", t.threads), Int("kMinBlocksPerSM", t.min_blocks),
                           Int("kPH", t.ph), Int("kPW", t.pw),
                           Int("kBlocksPerSample", t.blocks_per_sample), Int("kCSplit", 1)}});
    const size_t partials = plan.AddWorkspace(
        "per-block channel moments (count, mean, M2) x N*blocks_per_sample*C",
        static_cast<size_t>(n * t.blocks_per_sample * c) * 12);
    KernelLaunch k;
    k.symbol = "fj_conv_moments";
    k.body = "fj::conv_moments<Cfg, ConvMomentsTune>";
    k.purpose = "conv3d + pre-ops, per-block per-channel moments (no conv output stored)";
    k.grid = {static_cast<unsigned>(t.blocks_per_sample), static_cast<unsigned>(n), 1};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.min_blocks_per_sm = t.min_blocks;
    k.args = {Arg(Kind::kInput, "const float*", "x"),
              Arg(Kind::kParam, "const float*", "weight", info.weight_param),
              Arg(Kind::kParam, "const float*", "bias", info.bias_param),
              Arg(Kind::kWorkspace, "fj::Moments*", "partials", "", partials)};
    plan.kernels.push_back(k);
    KernelLaunch f;
    f.symbol = "fj_moments_mean";
    f.body = "fj::moments_mean_finalize<Cfg, ConvMomentsTune>";
    f.purpose = "merge moments in a fixed order -> group mean/rstd -> mean of the group_norm output";
    f.grid = {static_cast<unsigned>(n), 1, 1};
    f.block = {32, 1, 1};
    f.args = {Arg(Kind::kWorkspace, "const fj::Moments*", "partials", "", partials),
              Arg(Kind::kParam, "const float*", "gamma", info.gamma_param),
              Arg(Kind::kParam, "const float*", "beta", info.beta_param),
              Arg(Kind::kOutput, "float*", "y")};
    plan.kernels.push_back(f);
    return plan;
  }
};

// ---- convt-recompute-normalize ----------------------------------------------------------------

struct ConvTTune {
  int threads = 256, min_blocks = 2, rows_per_unit = 1, stat_blocks = 4, write_blocks = 4;
};

ConvTTune ChooseConvTTune(const ChainInfo& info, const PlanTarget& target) {
  ConvTTune t;
  const int64_t n = info.producer_shape[0];
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  const int64_t units = info.producer_shape[2] * conv.stride[1] * hq;  // warp units per sample
  const int64_t want = (static_cast<int64_t>(target.sm_count) * t.min_blocks * 2 + n / 2) / n;
  const int64_t most = std::max<int64_t>(1, units / (t.threads / 32));
  t.stat_blocks = t.write_blocks = static_cast<int>(std::clamp<int64_t>(want, 1, most));
  return t;
}

int64_t ConvTSharedBytes(const Chain& chain, const ChainInfo& info, const ConvTTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t cp = Round4(info.producer_shape[1]);
  const int64_t smem_w = conv.kernel[0] * conv.kernel[1] * chain.input[1] * conv.kernel[2] * cp + cp;
  return 4 * (smem_w + (t.threads / 32) * (2 * info.group_norm->groups + 1) + 2 * cp);
}

class ConvTRecomputeStrategy : public Strategy {
 public:
  std::string_view name() const override { return "convt-recompute-normalize"; }
  bool Applies(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    if (!CheapProducerWithNorm(info, OpKind::kConvTranspose3d) ||
        info.mean != MeanMode::kNone || info.macs_per_point > 64) {
      return false;
    }
    return ConvTSharedBytes(chain, info, ChooseConvTTune(info, target)) <= kStaticSharedLimit;
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * (4.0 / 3.0 + 4.0 * info.macs_per_point / 50.0);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    const ConvTTune t = ChooseConvTTune(info, target);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    const int64_t groups = info.group_norm->groups;
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "transposed conv split by output phase, weights in shared memory; pass 1 recomputes it for "
        "group moments without writing, pass 2 recomputes, normalizes and writes y once with "
        "coalesced stores";
    plan.includes = {"convt_group_norm.cuh"};
    plan.tunes.push_back({"ConvTTune",
                          {Int("kThreads", t.threads), Int("kMinBlocksPerSM", t.min_blocks),
                           Int("kRowsPerUnit", t.rows_per_unit),
                           Int("kStatBlocksPerSample", t.stat_blocks),
                           Int("kWriteBlocksPerSample", t.write_blocks),
                           Bool("kStreamingStores", true), Bool("kCoalesceStores", true)}});
    const size_t partials = plan.AddWorkspace(
        "per-block group moments x N*stat_blocks*groups",
        static_cast<size_t>(n * t.stat_blocks * groups) * 12);
    const size_t scale_shift = plan.AddWorkspace("per-channel (scale, shift) x N*C",
                                                 static_cast<size_t>(n * c) * 8);
    const KernelArg x = Arg(Kind::kInput, "const float*", "x");
    const KernelArg w = Arg(Kind::kParam, "const float*", "weight", info.weight_param);
    const KernelArg b = Arg(Kind::kParam, "const float*", "bias", info.bias_param);
    KernelLaunch k1;
    k1.symbol = "fj_convt_moments";
    k1.body = "fj::convt_group_moments<Cfg, ConvTTune>";
    k1.purpose = "recompute conv_transpose3d + pre-ops by phase, per-block group moments";
    k1.grid = {static_cast<unsigned>(t.stat_blocks), static_cast<unsigned>(n), 1};
    k1.block = {static_cast<unsigned>(t.threads), 1, 1};
    k1.min_blocks_per_sm = t.min_blocks;
    k1.args = {x, w, b, Arg(Kind::kWorkspace, "fj::Moments*", "partials", "", partials)};
    plan.kernels.push_back(k1);
    KernelLaunch k2;
    k2.symbol = "fj_scale_shift";
    k2.body = "fj::group_norm_scale_shift<Cfg, ConvTTune>";
    k2.purpose = "merge partials in a fixed order -> per-channel scale and shift";
    k2.grid = {static_cast<unsigned>(n), 1, 1};
    k2.block = {32, 1, 1};
    k2.args = {Arg(Kind::kWorkspace, "const fj::Moments*", "partials", "", partials),
               Arg(Kind::kParam, "const float*", "gamma", info.gamma_param),
               Arg(Kind::kParam, "const float*", "beta", info.beta_param),
               Arg(Kind::kWorkspace, "float2*", "scale_shift", "", scale_shift)};
    plan.kernels.push_back(k2);
    KernelLaunch k3;
    k3.symbol = "fj_convt_write";
    k3.body = "fj::convt_norm_write<Cfg, ConvTTune>";
    k3.purpose = "recompute conv_transpose3d + pre-ops, normalize, post-ops, write y once";
    k3.grid = {static_cast<unsigned>(t.write_blocks), static_cast<unsigned>(n), 1};
    k3.block = {static_cast<unsigned>(t.threads), 1, 1};
    k3.min_blocks_per_sm = t.min_blocks;
    k3.args = {x, w, b, Arg(Kind::kWorkspace, "const float2*", "scale_shift", "", scale_shift),
               Arg(Kind::kOutput, "float*", "y")};
    plan.kernels.push_back(k3);
    return plan;
  }
};

}  // namespace

void AddFastStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(std::make_unique<ConvMomentsMeanStrategy>());
  out->push_back(std::make_unique<ConvTRecomputeStrategy>());
}

}  // namespace fusejit::codegen
