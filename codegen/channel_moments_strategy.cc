// Strategy channel-moments-mean: "x | ops | group_norm | mean" chains without a convolution and
// without ops after the group_norm (templates/moments_mean.cuh). One pass reads x once and
// reduces per-channel moments of the pre-norm values (in double); the finalize merges them per
// group and writes the mean of the affine group_norm output, gamma_c (m_c - mu_g) rstd_g + beta_c.
// recompute-mean, the generic plan, reads x twice (statistics, then normalize-and-sum).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"
#include "codegen/tune_config.h"

namespace fusejit::codegen {
namespace {

struct ChannelMomentsTune {
  int64_t threads = 256;
  int64_t blocks_per_sample = 1;  // spatial chunks of each (sample, channel) row
};
constexpr TuneField<ChannelMomentsTune> kFields[] = {
    {"threads", "kThreads", &ChannelMomentsTune::threads},
    {"blocks_per_sample", "kBlocksPerSample", &ChannelMomentsTune::blocks_per_sample},
};
std::span<const TuneField<ChannelMomentsTune>> Fields() { return kFields; }

constexpr int64_t kMaxChannels = 256;  // moments_mean_finalize's shared arrays
constexpr int64_t kMinPointsPerBlock = 1024;

int64_t Spatial(const ChainInfo& info) {
  return info.producer_shape[2] * info.producer_shape[3] * info.producer_shape[4];
}

class ChannelMomentsMeanStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "channel-moments-mean"; }
  // Values are widened to float as loaded and reduced in double: f32, bf16, f16 chains (f64 ones
  // keep their double values: the generic plans).
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    return !info.producer && info.group_norm && info.mean != MeanMode::kNone &&
           info.post_ops.empty() && info.producer_shape[1] <= kMaxChannels &&
           info.producer_shape[0] <= 65535 && info.producer_shape[1] <= 65535;
  }
  // x read once (4 bytes a point at ~3 TB/s, as GenericCost counts them); recompute-mean reads it
  // twice.
  double Cost(const PlanInput& in) const override {
    return static_cast<double>(in.info.elements) * 4.0 / 3.0;
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    ChannelMomentsTune t;
    // About four blocks per SM, each at least kMinPointsPerBlock points of one row.
    const int64_t rows = info.producer_shape[0] * info.producer_shape[1];
    const int64_t want = (4 * int64_t{in.target.sm_count} + rows - 1) / rows;
    t.blocks_per_sample =
        std::clamp<int64_t>(want, 1, std::max<int64_t>(1, Spatial(info) / kMinPointsPerBlock));
    t.threads = Spatial(info) / t.blocks_per_sample >= 2048 ? 256 : 128;
    return ToConfig(name(), t, Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    const ChannelMomentsTune d = *Parse(DefaultConfig(in));
    std::vector<int64_t> blocks;
    for (int64_t v : {d.blocks_per_sample / 2, d.blocks_per_sample, 2 * d.blocks_per_sample,
                      4 * d.blocks_per_sample}) {
      if (v >= 1) blocks.push_back(v);
    }
    return {{"threads", {64, 128, 256, 512}}, {"blocks_per_sample", blocks}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<ChannelMomentsTune> t = Parse(config);
    if (!t.ok()) return t.status();
    if (t->threads < 32 || t->threads > 1024 || t->threads % 32 != 0) {
      return Invalid(
          config, absl::StrCat("threads ", t->threads, " is not a multiple of 32 in [32, 1024]"));
    }
    if (t->blocks_per_sample < 1 || t->blocks_per_sample > Spatial(in.info) ||
        t->blocks_per_sample > 65535) {
      return Invalid(config,
                     absl::StrCat("blocks_per_sample ", t->blocks_per_sample, " is not in [1, ",
                                  std::min<int64_t>(Spatial(in.info), 65535),
                                  "] (the spatial points of a channel)"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    if (absl::Status s = Validate(in, config); !s.ok()) return s;
    const ChainInfo& info = in.info;
    const ChannelMomentsTune t = *Parse(config);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.tune_config = config.ToString();
    plan.description =
        "one pass reads x once: per-channel moments of the pre-norm values (double, fixed-order "
        "merges); the mean of the affine group_norm output follows from them "
        "(gamma_c (m_c - mu_g) rstd_g + beta_c): nothing full-size stored";
    plan.includes = {"moments_mean.cuh"};
    plan.tunes.push_back(ToTuneStruct("ChannelMomentsTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-chunk channel moments (count, mean, M2; double) x N*blocks_per_sample*C",
        static_cast<size_t>(n * t.blocks_per_sample * c) * 24);
    KernelLaunch k;
    k.symbol = "fj_channel_moments";
    k.body = "fj::channel_moments_body<Cfg, ChannelMomentsTune>";
    k.purpose = "pre-ops, per-(sample, channel, chunk) moments of the pre-norm values";
    k.grid = {static_cast<unsigned>(t.blocks_per_sample), static_cast<unsigned>(c),
              static_cast<unsigned>(n)};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.args = {KernelArg::Input(),
              KernelArg::Workspace(ArgType::kMomentsD, "partials", partials, kWrite)};
    plan.kernels.push_back(k);
    plan.kernels.push_back(
        MomentsMeanFinalizeLaunch(info, "ChannelMomentsTune", ArgType::kMomentsD, partials));
    return plan;
  }

 private:
  absl::StatusOr<ChannelMomentsTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a channel-moments-mean config");
    return FromConfig(config, Fields());
  }
};

}  // namespace

std::unique_ptr<Strategy> MakeChannelMomentsMeanStrategy() {
  return std::make_unique<ChannelMomentsMeanStrategy>();
}

}  // namespace fusejit::codegen
