// conv-moments-mean: conv3d | ew* | group_norm | mean (seeds W2, W4).
// templates/direct_conv_moments.cuh + moments_mean.cuh: direct convolution, each thread a tile of
// outputs for all channels in registers, weights in shared memory; the mean of an affine
// group_norm output is gamma_c (m_c - mu_g) rstd_g + beta_c, so per-channel moments suffice and
// nothing full-size is stored. Launch shapes: heuristics measured on the H100 (DefaultConfig);
// tunable (TuneSpace, Validate).
#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"

namespace fusejit::codegen {
namespace {

// ---- conv-moments-mean ----------------------------------------------------------------------

struct ConvMomentsTune {
  int64_t threads = 128, min_blocks = 2, ph = 1, pw = 6, blocks_per_sample = 1, csplit = 1;
};

// One description of ConvMomentsTune: config text, constants in the source (its order is the
// order of direct_conv_moments.cuh's DirectConvTune).
constexpr TuneField<ConvMomentsTune> kConvMomentsFields[] = {
    {"threads", "kThreads", &ConvMomentsTune::threads},
    {"min_blocks", "kMinBlocksPerSM", &ConvMomentsTune::min_blocks},
    {"ph", "kPH", &ConvMomentsTune::ph},
    {"pw", "kPW", &ConvMomentsTune::pw},
    {"blocks_per_sample", "kBlocksPerSample", &ConvMomentsTune::blocks_per_sample},
    {"csplit", "kCSplit", &ConvMomentsTune::csplit},
};

ConvMomentsTune ChooseConvMomentsTune(const ChainInfo& info, const PlanTarget& target) {
  ConvMomentsTune t;
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  t.min_blocks = c <= 16 ? 3 : 2;
  t.pw = c <= 24 ? 6 : 4;
  t.pw = std::min<int64_t>(t.pw, info.producer_shape[4]);
  const int64_t tiles = info.producer_shape[2] * info.producer_shape[3] *
                        ((info.producer_shape[4] + t.pw - 1) / t.pw);
  const int64_t want = (static_cast<int64_t>(target.sm_count) * t.min_blocks + n / 2) / n;
  t.blocks_per_sample = std::clamp<int64_t>(want, 1, std::max<int64_t>(1, tiles / t.threads));
  return t;
}

// The compile-time shapes of direct_conv_moments.cuh (DirectConvGeom) for a tuning, computed the
// same way.
struct ConvMomentsGeometry {
  int64_t tiles = 0;         // output tiles of kPH x kPW points per sample
  int64_t slots = 0;         // tiles a block works on at once
  int64_t shared_bytes = 0;  // static shared memory of conv_moments
  int64_t accumulators = 0;  // floats per thread
};

ConvMomentsGeometry ConvMomentsGeom(const Chain& chain, const ChainInfo& info,
                                    const ConvMomentsTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t c = info.producer_shape[1], cs = c / t.csplit;
  const int64_t cp = t.csplit == 1 ? Round4(c) : c;
  const int64_t smem_w = chain.input[1] * conv.kernel[0] * conv.kernel[1] * conv.kernel[2] * cp + cp;
  const int64_t scratch = (t.threads / 32) * (2 * cs + 1);
  const int64_t wc = (t.pw - 1) * conv.stride[2] + (conv.kernel[2] - 1) * conv.dilation[2] + 1;
  const int64_t wcp = Round4(wc);
  const int64_t xbuf = (2 * wcp / 4) % 2 == 1 ? 2 * wcp : 2 * wcp + 4;
  ConvMomentsGeometry g;
  g.tiles = info.producer_shape[2] * ((info.producer_shape[3] + t.ph - 1) / t.ph) *
            ((info.producer_shape[4] + t.pw - 1) / t.pw);
  g.slots = t.threads / t.csplit;
  g.shared_bytes = 4 * (smem_w + scratch + (2 * cs + xbuf) * t.threads);
  g.accumulators = t.ph * t.pw * cs;
  return g;
}

// The checks direct_conv_moments.cuh static_asserts, plus registers and grid shape.
absl::Status CheckConvMoments(const Chain& chain, const ChainInfo& info, const ConvMomentsTune& t,
                              const TuneConfig& c) {
  if (absl::Status s = CheckBlock(c, t.threads, t.min_blocks); !s.ok()) return s;
  const int64_t channels = info.producer_shape[1];
  if (t.csplit < 1 || channels % t.csplit != 0 ||
      (t.csplit > 1 && (channels / t.csplit) % 4 != 0) || t.threads % (32 * t.csplit) != 0) {
    return Invalid(c, absl::StrCat("csplit ", t.csplit, " must split ", channels,
                                   " channels into parts of a multiple of 4 and divide threads/32"));
  }
  if (t.ph < 1 || t.pw < 1 || t.ph > info.producer_shape[3] || t.pw > info.producer_shape[4]) {
    return Invalid(c, absl::StrCat("ph x pw = ", t.ph, " x ", t.pw, " must be within the ",
                                   info.producer_shape[3], " x ", info.producer_shape[4],
                                   " output plane"));
  }
  const ConvMomentsGeometry g = ConvMomentsGeom(chain, info, t);
  if (g.shared_bytes > kStaticSharedLimit) {
    return Invalid(c, absl::StrCat("needs ", g.shared_bytes, " bytes of static shared memory, at "
                                   "most ", kStaticSharedLimit));
  }
  if (g.accumulators + kRegisterOverhead > RegisterCap(t.threads, t.min_blocks)) {
    return Invalid(c, absl::StrCat(g.accumulators, " accumulators per thread do not fit the ",
                                   RegisterCap(t.threads, t.min_blocks),
                                   "-register cap of threads x min_blocks"));
  }
  const int64_t most = std::max<int64_t>(1, g.tiles / g.slots);
  if (t.blocks_per_sample < 1 || t.blocks_per_sample > most) {
    return Invalid(c, absl::StrCat("blocks_per_sample ", t.blocks_per_sample, " must be in [1, ",
                                   most, "] (", g.tiles, " tiles, ", g.slots, " per block round)"));
  }
  return absl::OkStatus();
}

// The heuristic tuning, or, where its block does not fit (static shared memory, registers),
// the first of a few smaller ones that does: fewer threads per block (with more blocks per SM) and
// narrower tiles. Returns the heuristic one when none fits (Applies() then says no).
ConvMomentsTune DefaultConvMomentsTune(const Chain& chain, const ChainInfo& info,
                                       const PlanTarget& target) {
  const ConvMomentsTune base = ChooseConvMomentsTune(info, target);
  for (int64_t threads : {base.threads, base.threads / 2, base.threads / 4}) {
    for (int64_t pw : {base.pw, std::min<int64_t>(base.pw, 4), std::min<int64_t>(base.pw, 2)}) {
      ConvMomentsTune t = base;
      t.threads = threads;
      t.min_blocks = std::min<int64_t>(base.min_blocks * base.threads / threads, 8);
      t.pw = pw;
      const int64_t tiles = info.producer_shape[2] * info.producer_shape[3] *
                            ((info.producer_shape[4] + t.pw - 1) / t.pw);
      t.blocks_per_sample =
          std::clamp<int64_t>(base.blocks_per_sample, 1, std::max<int64_t>(1, tiles / t.threads));
      if (CheckConvMoments(chain, info, t, TuneConfig{}).ok()) return t;
    }
  }
  return base;
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
    const ConvMomentsTune t = DefaultConvMomentsTune(chain, info, target);
    return CheckConvMoments(chain, info, t, ToConfig(name(), t, Fields())).ok();
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * 2.0 * info.macs_per_point / 50.0;
  }
  TuneConfig DefaultConfig(const Chain& chain, const PlanTarget& target) const override {
    return ToConfig(name(), DefaultConvMomentsTune(chain, AnalyzeChain(chain), target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    const ConvMomentsTune t = DefaultConvMomentsTune(chain, info, target);
    return {{"threads", {64, 128, 256}},
            {"min_blocks", {1, 2, 3, 4}},
            {"ph", {1, 2}},
            {"pw", {2, 3, 4, 5, 6, 8}},
            {"blocks_per_sample",
             BlocksPerSampleCandidates(t.blocks_per_sample, info.producer_shape[0], target)},
            {"csplit", {1, 2, 4}}};
  }
  absl::Status Validate(const Chain& chain, const PlanTarget& target,
                        const TuneConfig& config) const override {
    absl::StatusOr<ConvMomentsTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvMoments(chain, AnalyzeChain(chain), *t, config);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    return MakeTunedPlan(chain, target, DefaultConfig(chain, target));
  }
  absl::StatusOr<Plan> MakeTunedPlan(const Chain& chain, const PlanTarget& target,
                                     const TuneConfig& config) const override {
    if (absl::Status s = Validate(chain, target, config); !s.ok()) return s;
    const ChainInfo info = AnalyzeChain(chain);
    const ConvMomentsTune t = *Parse(config);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "direct conv3d, a tile of outputs for all channels per thread, weights in shared memory; "
        "per-block per-channel moments of the pre-norm values; the mean of the affine group_norm "
        "output follows from them (gamma_c (m_c - mu_g) rstd_g + beta_c): nothing full-size stored";
    plan.includes = {"direct_conv_moments.cuh", "moments_mean.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvMomentsTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-block channel moments (count, mean, M2) x N*blocks_per_sample*C",
        static_cast<size_t>(n * t.blocks_per_sample * c) * 12);
    KernelLaunch k;
    k.symbol = "fj_conv_moments";
    k.body = "fj::conv_moments<Cfg, ConvMomentsTune>";
    k.purpose = "conv3d + pre-ops, per-block per-channel moments (no conv output stored)";
    k.grid = {static_cast<unsigned>(t.blocks_per_sample), static_cast<unsigned>(n), 1};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
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

 private:
  static std::span<const TuneField<ConvMomentsTune>> Fields() { return kConvMomentsFields; }
  absl::StatusOr<ConvMomentsTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a conv-moments-mean config");
    return FromConfig(config, Fields());
  }
};


}  // namespace

std::unique_ptr<Strategy> MakeConvMomentsMeanStrategy() { return std::make_unique<ConvMomentsMeanStrategy>(); }

}  // namespace fusejit::codegen
