// Strategy slice-normalize: "x | ops | group_norm | ops" chains without a convolution and without
// mean whose (sample, group) slice of floats fits in one block's shared memory
// (templates/group_slice.cuh): one kernel reads x once, keeps the slice on chip for the group's
// statistics and writes y once. The generic plans (recompute-normalize, store-normalize) take two
// passes over x, which remain the plans for larger groups.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"
#include "codegen/tune_config.h"

namespace fusejit::codegen {
namespace {

struct SliceTune {
  int64_t threads = 512;
};
constexpr TuneField<SliceTune> kFields[] = {{"threads", "kThreads", &SliceTune::threads}};
std::span<const TuneField<SliceTune>> Fields() { return kFields; }

// Floats of one (sample, group) slice (SliceNormalize<Cfg>::kSlice).
int64_t SliceValues(const ChainInfo& info) {
  const Shape& p = info.producer_shape;
  return p[1] / info.group_norm->groups * p[2] * p[3] * p[4];
}

class SliceNormalizeStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "slice-normalize"; }
  // Values are widened to float as loaded (f64 chains keep double values: the generic plans).
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    if (info.producer || !info.group_norm || info.mean != MeanMode::kNone) return false;
    const Shape& p = info.producer_shape;
    return SliceValues(info) * 4 <= SharedOptInLimit(in.target.arch) &&
           info.group_norm->groups <= 65535 && p[0] <= 65535;
  }
  // x read once and y written once (4 bytes a point each at ~3 TB/s, as GenericCost counts), on
  // one block per (sample, group): charged in proportion where fewer than half the SMs get one.
  double Cost(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const double blocks = static_cast<double>(info.producer_shape[0] * info.group_norm->groups);
    const double fill = std::min(1.0, blocks / (0.5 * std::max(1, in.target.sm_count)));
    return static_cast<double>(info.elements) * 8.0 / 3.0 / fill;
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    SliceTune t;
    // One block per (sample, group) at a time per SM when the slice takes most of the shared
    // memory: as many threads as there are values to keep busy, up to 1024.
    const int64_t v = SliceValues(in.info);
    t.threads = v >= 16384 ? 1024 : v >= 4096 ? 512 : 256;
    return ToConfig(name(), t, Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput&) const override {
    return {{"threads", {128, 256, 512, 1024}}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<SliceTune> t = Parse(config);
    if (!t.ok()) return t.status();
    if (t->threads < 32 || t->threads > 1024 || t->threads % 32 != 0) {
      return Invalid(
          config, absl::StrCat("threads ", t->threads, " is not a multiple of 32 in [32, 1024]"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    if (absl::Status s = Validate(in, config); !s.ok()) return s;
    const ChainInfo& info = in.info;
    const SliceTune t = *Parse(config);
    const int64_t bytes = SliceValues(info) * 4;
    Plan plan;
    plan.strategy = std::string(name());
    plan.tune_config = config.ToString();
    plan.description = absl::StrCat(
        "one block per (sample, group) keeps pre-ops(x) of its slice in shared memory (", bytes,
        " bytes): group mean and variance from there (double, fixed order), then normalize, "
        "post-ops, y written once; x read once");
    plan.includes = {"group_slice.cuh"};
    plan.tunes.push_back(ToTuneStruct("SliceTune", t, Fields()));
    KernelLaunch k;
    k.symbol = "fj_slice_normalize";
    k.body = "fj::slice_normalize_body<Cfg, SliceTune>";
    k.purpose = "y = post-ops(group_norm(pre-ops(x))), each (sample, group) slice on chip";
    k.grid = {static_cast<unsigned>(info.group_norm->groups),
              static_cast<unsigned>(info.producer_shape[0]), 1};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.shared_bytes = static_cast<unsigned>(bytes);  // SliceNormalize<Cfg>::kSmemBytes
    k.args = {KernelArg::Input(), KernelArg::Param("gamma", info.gamma_param),
              KernelArg::Param("beta", info.beta_param), KernelArg::Output()};
    plan.kernels.push_back(k);
    return plan;
  }

 private:
  absl::StatusOr<SliceTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a slice-normalize config");
    return FromConfig(config, Fields());
  }
};

}  // namespace

std::unique_ptr<Strategy> MakeSliceNormalizeStrategy() {
  return std::make_unique<SliceNormalizeStrategy>();
}

}  // namespace fusejit::codegen
