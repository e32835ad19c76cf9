// convt-recompute-normalize: conv_transpose3d | ew* | group_norm | ew* (seed W1).
// templates/convt_group_norm.cuh: a statistics pass recomputing the transposed convolution by
// output phase without writing, then a pass recomputing it, normalizing and writing y once.
// Launch shapes: heuristics measured on the H100 (DefaultConfig); tunable (TuneSpace, Validate).
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

// ---- convt-recompute-normalize ----------------------------------------------------------------

struct ConvTTune {
  int64_t threads = 256, min_blocks = 2, rows_per_unit = 1, stat_blocks = 4, write_blocks = 4,
          streaming_stores = 1, coalesce_stores = 1;
};

// One description of ConvTTune (the order of convt_group_norm.cuh's ConvTGroupNormTune).
constexpr TuneField<ConvTTune> kConvTFields[] = {
    {"threads", "kThreads", &ConvTTune::threads},
    {"min_blocks", "kMinBlocksPerSM", &ConvTTune::min_blocks},
    {"rows_per_unit", "kRowsPerUnit", &ConvTTune::rows_per_unit},
    {"stat_blocks", "kStatBlocksPerSample", &ConvTTune::stat_blocks},
    {"write_blocks", "kWriteBlocksPerSample", &ConvTTune::write_blocks},
    {"streaming_stores", "kStreamingStores", &ConvTTune::streaming_stores, /*is_bool=*/true},
    {"coalesce_stores", "kCoalesceStores", &ConvTTune::coalesce_stores, /*is_bool=*/true},
};

// Warp units per sample (convt_group_norm.cuh ConvTGeom::kUnits): rows of one h phase, in groups
// of rows_per_unit.
int64_t ConvTUnits(const ChainInfo& info, int64_t rows_per_unit) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  return info.producer_shape[2] * conv.stride[1] * ((hq + rows_per_unit - 1) / rows_per_unit);
}

// Accumulators per lane: acc[kRowsPerUnit][kSW][kC].
int64_t ConvTAccumulators(const ChainInfo& info, const ConvTTune& t) {
  return t.rows_per_unit * info.producer->conv.stride[2] * info.producer_shape[1];
}

ConvTTune ChooseConvTTune(const ChainInfo& info, const PlanTarget& target) {
  ConvTTune t;
  const int64_t n = info.producer_shape[0];
  // Two blocks an SM unless the accumulators would spill under that register cap.
  if (ConvTAccumulators(info, t) + kRegisterOverhead > RegisterCap(t.threads, t.min_blocks)) {
    t.min_blocks = 1;
  }
  const int64_t want = (static_cast<int64_t>(target.sm_count) * 2 * 2 + n / 2) / n;
  const int64_t most = std::max<int64_t>(1, ConvTUnits(info, 1) / (t.threads / 32));
  t.stat_blocks = t.write_blocks = std::clamp<int64_t>(want, 1, most);
  return t;
}

int64_t ConvTSharedBytes(const Chain& chain, const ChainInfo& info, const ConvTTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t cp = Round4(info.producer_shape[1]);
  const int64_t smem_w = conv.kernel[0] * conv.kernel[1] * chain.input[1] * conv.kernel[2] * cp + cp;
  return 4 * (smem_w + (t.threads / 32) * (2 * info.group_norm->groups + 1) + 2 * cp);
}

// The checks convt_group_norm.cuh makes, plus registers and grid shape.
absl::Status CheckConvT(const Chain& chain, const ChainInfo& info, const ConvTTune& t,
                        const TuneConfig& c) {
  if (absl::Status s = CheckBlock(c, t.threads, t.min_blocks); !s.ok()) return s;
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  if (t.rows_per_unit < 1 || t.rows_per_unit > hq) {
    return Invalid(c, absl::StrCat("rows_per_unit ", t.rows_per_unit, " must be in [1, ", hq,
                                   "] (rows per h phase)"));
  }
  const int64_t shared = ConvTSharedBytes(chain, info, t);
  if (shared > kStaticSharedLimit) {
    return Invalid(c, absl::StrCat("needs ", shared, " bytes of static shared memory, at most ",
                                   kStaticSharedLimit));
  }
  const int64_t acc = ConvTAccumulators(info, t);
  if (acc + kRegisterOverhead > RegisterCap(t.threads, t.min_blocks)) {
    return Invalid(c, absl::StrCat(acc, " accumulators per lane do not fit the ",
                                   RegisterCap(t.threads, t.min_blocks),
                                   "-register cap of threads x min_blocks"));
  }
  const int64_t most = std::max<int64_t>(1, ConvTUnits(info, t.rows_per_unit) / (t.threads / 32));
  for (auto [what, v] : {std::pair{"stat_blocks", t.stat_blocks}, {"write_blocks", t.write_blocks}}) {
    if (v < 1 || v > most) {
      return Invalid(c, absl::StrCat(what, " ", v, " must be in [1, ", most,
                                     "] (warp units per sample / warps per block)"));
    }
  }
  return absl::OkStatus();
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
    const ConvTTune t = ChooseConvTTune(info, target);
    return CheckConvT(chain, info, t, ToConfig(name(), t, Fields())).ok();
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * (4.0 / 3.0 + 4.0 * info.macs_per_point / 50.0);
  }
  TuneConfig DefaultConfig(const Chain& chain, const PlanTarget& target) const override {
    return ToConfig(name(), ChooseConvTTune(AnalyzeChain(chain), target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    const ConvTTune t = ChooseConvTTune(info, target);
    const int64_t n = info.producer_shape[0];
    return {{"threads", {128, 256, 512}},
            {"min_blocks", {1, 2, 3, 4}},
            {"rows_per_unit", {1, 2, 4}},
            {"stat_blocks", BlocksPerSampleCandidates(t.stat_blocks, n, target)},
            {"write_blocks", BlocksPerSampleCandidates(t.write_blocks, n, target)},
            {"streaming_stores", {0, 1}},
            {"coalesce_stores", {0, 1}}};
  }
  absl::Status Validate(const Chain& chain, const PlanTarget& target,
                        const TuneConfig& config) const override {
    absl::StatusOr<ConvTTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvT(chain, AnalyzeChain(chain), *t, config);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    return MakeTunedPlan(chain, target, DefaultConfig(chain, target));
  }
  absl::StatusOr<Plan> MakeTunedPlan(const Chain& chain, const PlanTarget& target,
                                     const TuneConfig& config) const override {
    if (absl::Status s = Validate(chain, target, config); !s.ok()) return s;
    const ChainInfo info = AnalyzeChain(chain);
    const ConvTTune t = *Parse(config);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    const int64_t groups = info.group_norm->groups;
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "transposed conv split by output phase, weights in shared memory; pass 1 recomputes it for "
        "group moments without writing, pass 2 recomputes, normalizes and writes y once with "
        "coalesced stores";
    plan.includes = {"convt_group_norm.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvTTune", t, Fields()));
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
    k1.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
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
    k3.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k3.args = {x, w, b, Arg(Kind::kWorkspace, "const float2*", "scale_shift", "", scale_shift),
               Arg(Kind::kOutput, "float*", "y")};
    plan.kernels.push_back(k3);
    return plan;
  }

 private:
  static std::span<const TuneField<ConvTTune>> Fields() { return kConvTFields; }
  absl::StatusOr<ConvTTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a convt-recompute-normalize config");
    return FromConfig(config, Fields());
  }
};


}  // namespace

std::unique_ptr<Strategy> MakeConvTRecomputeStrategy() { return std::make_unique<ConvTRecomputeStrategy>(); }

}  // namespace fusejit::codegen
