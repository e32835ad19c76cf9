// The transposed-convolution strategies for conv_transpose3d | ew* | group_norm | ew* with a
// biased producer and at most 32 output channels (templates/convt_group_norm.cuh: phase-split
// direct transposed convolution, a lane computes all channels of its outputs, weights in dynamic
// shared memory):
//   convt-recompute-normalize  (seed W1; cheap producer, <= 64 MACs a point): a statistics pass
//       recomputing the convolution without writing, then a pass recomputing it, normalizing and
//       writing y once -- y moves through memory once.
//   convt-store-normalize      (producer too expensive to compute twice, e.g. stride 1 with 16
//       input channels): the statistics pass also stores the pre-norm values into y, which is
//       then normalized in place -- the convolution runs once, y moves three times.
//   convt-direct               (conv_transpose3d | ew*, no group_norm, no mean; e.g. W1's
//       convolution alone, which the backward recomputes): the write pass alone, y = ops(v).
// Launch shapes: heuristics measured on the H100 (DefaultConfig); tunable (TuneSpace, Validate).
#include "codegen/convt_strategy.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"
#include "fmt/format.h"

namespace fusejit::codegen {
namespace {

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
// The store plan has no write pass: its tuning is the first four fields.
constexpr std::span<const TuneField<ConvTTune>> kConvTStoreFields(kConvTFields, 4);
// The direct plan has no statistics pass.
constexpr TuneField<ConvTTune> kConvTDirectFields[] = {
    {"threads", "kThreads", &ConvTTune::threads},
    {"min_blocks", "kMinBlocksPerSM", &ConvTTune::min_blocks},
    {"rows_per_unit", "kRowsPerUnit", &ConvTTune::rows_per_unit},
    {"write_blocks", "kWriteBlocksPerSample", &ConvTTune::write_blocks},
    {"streaming_stores", "kStreamingStores", &ConvTTune::streaming_stores, /*is_bool=*/true},
    {"coalesce_stores", "kCoalesceStores", &ConvTTune::coalesce_stores, /*is_bool=*/true},
};
constexpr std::span<const TuneField<ConvTTune>> kConvTDirect(kConvTDirectFields);

// Which passes a plan runs: the statistics pass (stat_blocks), the write pass (write_blocks).
enum class ConvTPasses { kBoth, kStatsOnly, kWriteOnly };

// Rows a warp works on side by side (convt_group_norm.cuh ConvTGeom::kLR): 32 / (lanes per row,
// a power of two >= the q values of a row, at least 4).
int64_t ConvTLaneRows(const ChainInfo& info) {
  const int64_t sw = info.producer->conv.stride[2];
  const int64_t wq = (info.producer_shape[4] + sw - 1) / sw;
  const int64_t lpr = wq > 16 ? 32 : wq > 8 ? 16 : wq > 4 ? 8 : 4;
  return 32 / lpr;
}

// Warp units per sample (ConvTGeom::kUnits): rows of one h phase, in groups of rows_per_unit x
// lane rows.
int64_t ConvTUnits(const ChainInfo& info, int64_t rows_per_unit) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  const int64_t rows = rows_per_unit * ConvTLaneRows(info);
  return info.producer_shape[2] * conv.stride[1] * ((hq + rows - 1) / rows);
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
  // Smaller blocks (down to 4 warps) where a sample has too few warp units to give every SM a
  // block (sweep W1-f: 128 threads measured best, 64 slower).
  while (t.threads > 128 && n * (ConvTUnits(info, 1) / (t.threads / 32)) < target.sm_count) {
    t.threads /= 2;
  }
  const int64_t want = (static_cast<int64_t>(target.sm_count) * 2 * 2 + n / 2) / n;
  const int64_t most = std::max<int64_t>(1, ConvTUnits(info, 1) / (t.threads / 32));
  t.stat_blocks = t.write_blocks = std::clamp<int64_t>(want, 1, most);
  return t;
}

// Dynamic shared memory of the convolution kernels (ConvTGeom::kDynSmemBytes): the weights.
int64_t ConvTDynamicSharedBytes(const Chain& chain, const ChainInfo& info) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t cp = Round4(info.producer_shape[1]);
  return 4 * (conv.kernel[0] * conv.kernel[1] * chain.input[1] * conv.kernel[2] * cp + cp);
}
// Static shared memory: reduction scratch and per-channel (scale, shift) (none without
// group_norm: the direct plan).
int64_t ConvTStaticSharedBytes(const ChainInfo& info, const ConvTTune& t) {
  if (info.group_norm == nullptr) return 0;
  return 4 * (t.threads / 32) * (2 * info.group_norm->groups + 1) + 8 * info.producer_shape[1];
}

// The checks convt_group_norm.cuh makes, plus shared memory, registers and grid shape, for a
// plan running `passes` (the other pass's blocks are unused).
absl::Status CheckConvT(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                        const ConvTTune& t, const TuneConfig& c, ConvTPasses passes) {
  if (absl::Status s = CheckBlock(c, t.threads, t.min_blocks); !s.ok()) return s;
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  if (t.rows_per_unit < 1 || t.rows_per_unit > hq) {
    return Invalid(c, absl::StrCat("rows_per_unit ", t.rows_per_unit, " must be in [1, ", hq,
                                   "] (rows per h phase)"));
  }
  const int64_t dynamic = ConvTDynamicSharedBytes(chain, info);
  const int64_t fixed = ConvTStaticSharedBytes(info, t);
  const int64_t limit = SharedOptInLimit(target.arch);
  if (fixed > kStaticSharedLimit || dynamic + fixed > limit ||
      (dynamic + fixed + 1024) * t.min_blocks > limit + 1024) {
    return Invalid(c, absl::StrCat("needs ", dynamic, " bytes of weights + ", fixed,
                                   " bytes of scratch in shared memory per block x min_blocks ",
                                   t.min_blocks, "; ", target.arch, " allows ", limit,
                                   " per block (and per SM)"));
  }
  const int64_t acc = ConvTAccumulators(info, t);
  if (acc + kRegisterOverhead > RegisterCap(t.threads, t.min_blocks)) {
    return Invalid(c, absl::StrCat(acc, " accumulators per lane do not fit the ",
                                   RegisterCap(t.threads, t.min_blocks),
                                   "-register cap of threads x min_blocks"));
  }
  const int64_t most = std::max<int64_t>(1, ConvTUnits(info, t.rows_per_unit) / (t.threads / 32));
  for (auto [what, v] : {std::pair{"stat_blocks", t.stat_blocks}, {"write_blocks", t.write_blocks}}) {
    const bool stats = std::string_view(what) == "stat_blocks";
    if ((stats && passes == ConvTPasses::kWriteOnly) ||
        (!stats && passes == ConvTPasses::kStatsOnly)) {
      continue;
    }
    if (v < 1 || v > most) {
      return Invalid(c, absl::StrCat(what, " ", v, " must be in [1, ", most,
                                     "] (warp units per sample / warps per block)"));
    }
  }
  return absl::OkStatus();
}

// The cost models' factor for the FFMA loops, which reach ~50 TFLOP/s only with a few input
// channels (W1: Cin 3): measured on the H100 (2026-11-23, bench/conv_engine_sweep.py T7, T10, B3)
// 2.5x to 7x slower than the estimate above 4 input channels, growing with Cin.
double ConvTCinFactor(const Chain& chain) {
  return chain.input[1] <= 4 ? 1.0 : 1.5 + static_cast<double>(chain.input[1]) / 6.0;
}

// A config of strategy `name` (its fields) -> the tuning.
absl::StatusOr<ConvTTune> ParseConvT(const TuneConfig& config, std::string_view name,
                                     std::span<const TuneField<ConvTTune>> fields) {
  if (config.strategy != name) {
    return Invalid(config, absl::StrCat("not a ", std::string(name), " config"));
  }
  return FromConfig(config, fields);
}

// Both plans: `store` false = convt-recompute-normalize, true = convt-store-normalize.
class ConvTStrategy : public Strategy {
 public:
  explicit ConvTStrategy(bool store) : store_(store) {}
  std::string_view name() const override {
    return store_ ? "convt-store-normalize" : "convt-recompute-normalize";
  }
  // The recompute plan reads x and the parameters as the chain's dtype and rounds y once, so
  // bf16/f16 chains run natively; the store plan keeps pre-norm values in y (f32 only).
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || (!store_ && (dtype == DType::kBF16 || dtype == DType::kF16));
  }
  bool Applies(const PlanInput& in) const override {
    if (!HasAmpereFeatures(in.target.arch)) return false;  // cp.async, mma.sync
    const ChainInfo& info = in.info;
    if (!info.producer || info.producer->kind != OpKind::kConvTranspose3d ||
        !info.producer->conv.bias || !info.group_norm || info.mean != MeanMode::kNone ||
        info.producer_shape[1] > 32) {
      return false;
    }
    // Recompute: cheap enough to run twice. Store: a loop body (Cin x KW x C FFMAs, unrolled)
    // that stays small.
    const ConvAttrs& conv = info.producer->conv;
    if (store_ ? (info.macs_per_point > 1024 || in.chain.input[1] * conv.kernel[2] > 192)
               : info.macs_per_point > 64) {
      return false;
    }
    const ConvTTune t = ChooseConvTTune(info, in.target);
    return CheckConvT(in.chain, info, in.target, t, ToConfig(name(), t, Fields()), Passes()).ok();
  }
  double Cost(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    return ConvTCinFactor(in.chain) * static_cast<double>(info.elements) *
           (store_ ? 12.0 / 3.0 + 2.0 * info.macs_per_point / 50.0
                   : 4.0 / 3.0 + 4.0 * info.macs_per_point / 50.0);
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), ChooseConvTTune(in.info, in.target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const ConvTTune t = ChooseConvTTune(info, in.target);
    const int64_t n = info.producer_shape[0];
    std::vector<TuneParam> space = {
        {"threads", {128, 256, 512}},
        {"min_blocks", {1, 2, 3, 4}},
        {"rows_per_unit", {1, 2, 4}},
        {"stat_blocks", BlocksPerSampleCandidates(t.stat_blocks, n, in.target)}};
    if (!store_) {
      space.push_back({"write_blocks", BlocksPerSampleCandidates(t.write_blocks, n, in.target)});
      space.push_back({"streaming_stores", {0, 1}});
      space.push_back({"coalesce_stores", {0, 1}});
    }
    return space;
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<ConvTTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvT(in.chain, in.info, in.target, *t, config, Passes());
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const ConvTTune t = *Parse(config);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    const int64_t groups = info.group_norm->groups;
    const unsigned dynamic = static_cast<unsigned>(ConvTDynamicSharedBytes(in.chain, info));
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        store_ ? "transposed conv split by output phase, weights in shared memory; one pass "
                 "computes it, stores the pre-norm values into y and takes group moments, then y "
                 "is normalized in place"
               : "transposed conv split by output phase, weights in shared memory; pass 1 "
                 "recomputes it for group moments without writing, pass 2 recomputes, normalizes "
                 "and writes y once with coalesced stores";
    plan.includes = {"convt_group_norm.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvTTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-block group moments x N*stat_blocks*groups",
        static_cast<size_t>(n * t.stat_blocks * groups) * 12);
    const size_t scale_shift = plan.AddWorkspace("per-channel (scale, shift) x N*C",
                                                 static_cast<size_t>(n * c) * 8);
    const KernelArg y = KernelArg::Output();
    KernelLaunch k1;
    k1.grid = {static_cast<unsigned>(t.stat_blocks), static_cast<unsigned>(n), 1};
    k1.block = {static_cast<unsigned>(t.threads), 1, 1};
    k1.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k1.shared_bytes = dynamic;
    k1.args = ProducerArgs(info);
    k1.args.push_back(KernelArg::Workspace(ArgType::kMoments, "partials", partials, kWrite));
    if (store_) {
      k1.symbol = "fj_convt_store_moments";
      k1.body = "fj::convt_group_moments<Cfg, ConvTTune, true>";
      k1.purpose = "conv_transpose3d + pre-ops by phase, pre-norm values into y, group moments";
      k1.args.push_back(y);
    } else {
      k1.symbol = "fj_convt_moments";
      k1.body = "fj::convt_moments_body<Cfg, ConvTTune>";
      k1.purpose = "recompute conv_transpose3d + pre-ops by phase, per-block group moments";
      // Where the kernel stores u for a training forward (codegen::SaveProducerOutput binds it).
      k1.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    }
    plan.kernels.push_back(k1);
    plan.kernels.push_back(GroupNormScaleShiftLaunch(info, "ConvTTune", partials, scale_shift));
    const KernelArg ss = KernelArg::Workspace(ArgType::kFloat2, "scale_shift", scale_shift, kRead);
    KernelLaunch k3;
    if (store_) {
      const int64_t plane = info.producer_shape[2] * info.producer_shape[3] * info.producer_shape[4];
      const int64_t vec = plane % 4 == 0 ? 4 : 1;  // ConvTGeom::kApplyVec
      k3.symbol = "fj_convt_apply";
      k3.body = "fj::convt_apply_inplace<Cfg, ConvTTune>";
      k3.purpose = "y = post(y * scale + shift) in place";
      k3.grid = {static_cast<unsigned>((plane / vec + 255) / 256), static_cast<unsigned>(n * c), 1};
      k3.block = {256, 1, 1};
      k3.args = {ss, y};
    } else {
      k3.symbol = "fj_convt_write";
      k3.body = "fj::convt_norm_write<Cfg, ConvTTune>";
      k3.purpose = "recompute conv_transpose3d + pre-ops, normalize, post-ops, write y once";
      k3.grid = {static_cast<unsigned>(t.write_blocks), static_cast<unsigned>(n), 1};
      k3.block = {static_cast<unsigned>(t.threads), 1, 1};
      k3.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
      k3.shared_bytes = dynamic;
      k3.args = ProducerArgs(info);
      k3.args.push_back(ss);
      k3.args.push_back(y);
    }
    plan.kernels.push_back(k3);
    return plan;
  }

 private:
  std::span<const TuneField<ConvTTune>> Fields() const {
    return store_ ? kConvTStoreFields : std::span<const TuneField<ConvTTune>>(kConvTFields);
  }
  ConvTPasses Passes() const { return store_ ? ConvTPasses::kStatsOnly : ConvTPasses::kBoth; }
  absl::StatusOr<ConvTTune> Parse(const TuneConfig& config) const {
    return ParseConvT(config, name(), Fields());
  }
  bool store_;
};

// convt-direct: conv_transpose3d | ew* without group_norm or mean, one pass writing y (and u in
// a training forward). Same domain as convt-recompute-normalize's convolution.
class ConvTDirectStrategy : public Strategy {
 public:
  std::string_view name() const override { return "convt-direct"; }
  // x and the parameters read as the chain's dtype, y rounded once (as the recompute plan).
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  bool Applies(const PlanInput& in) const override {
    if (!HasAmpereFeatures(in.target.arch)) return false;  // cp.async
    const ChainInfo& info = in.info;
    if (!info.producer || info.producer->kind != OpKind::kConvTranspose3d ||
        !info.producer->conv.bias || info.group_norm || info.mean != MeanMode::kNone ||
        info.producer_shape[1] > 32 || info.macs_per_point > 64) {
      return false;
    }
    const ConvTTune t = ChooseConvTTune(info, in.target);
    return CheckConvT(in.chain, info, in.target, t, ToConfig(name(), t, kConvTDirect),
                      ConvTPasses::kWriteOnly)
        .ok();
  }
  double Cost(const PlanInput& in) const override {
    // convt-recompute-normalize's write pass alone: y written once, the convolution once.
    const ChainInfo& info = in.info;
    return ConvTCinFactor(in.chain) * static_cast<double>(info.elements) *
           (4.0 / 3.0 + 2.0 * info.macs_per_point / 50.0);
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), ChooseConvTTune(in.info, in.target), kConvTDirect);
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    const ConvTTune t = ChooseConvTTune(in.info, in.target);
    return {{"threads", {128, 256, 512}},
            {"min_blocks", {1, 2, 3, 4}},
            {"rows_per_unit", {1, 2, 4}},
            {"write_blocks",
             BlocksPerSampleCandidates(t.write_blocks, in.info.producer_shape[0], in.target)},
            {"streaming_stores", {0, 1}},
            {"coalesce_stores", {0, 1}}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<ConvTTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvT(in.chain, in.info, in.target, *t, config, ConvTPasses::kWriteOnly);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const ConvTTune t = *Parse(config);
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "transposed conv split by output phase, weights in shared memory; one pass computes it, "
        "applies the ops and writes y once with coalesced stores";
    plan.includes = {"convt_group_norm.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvTTune", t, kConvTDirect));
    KernelLaunch k;
    k.symbol = "fj_convt_direct";
    k.body = "fj::convt_direct_write<Cfg, ConvTTune>";
    k.purpose = "conv_transpose3d by phase + the ops, write y once";
    k.grid = {static_cast<unsigned>(t.write_blocks), static_cast<unsigned>(info.producer_shape[0]),
              1};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k.shared_bytes = static_cast<unsigned>(ConvTDynamicSharedBytes(in.chain, info));
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Output());
    // Where the kernel stores u for a training forward (codegen::SaveProducerOutput binds it).
    k.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    plan.kernels.push_back(k);
    return plan;
  }

 private:
  absl::StatusOr<ConvTTune> Parse(const TuneConfig& config) const {
    return ParseConvT(config, name(), kConvTDirect);
  }
};

}  // namespace

std::optional<ConvTSums> ChooseConvTSums(const Chain& chain, const ChainInfo& info,
                                         const PlanTarget& target, std::string* why) {
  const auto refuse = [&](std::string reason) -> std::optional<ConvTSums> {
    *why = std::move(reason);
    return std::nullopt;
  };
  if (!HasAmpereFeatures(target.arch)) return refuse("no cp.async before sm_80");
  if (!info.producer || info.producer->kind != OpKind::kConvTranspose3d ||
      !info.producer->conv.bias || !info.group_norm || info.producer_shape[1] > 32) {
    return refuse("not a biased conv_transpose3d with at most 32 outputs before group_norm");
  }
  // H100, 2026-11-27 (BENCHMARKS.md, fifteenth session), against bwd_sums reading u and grad_y:
  // W1 (10.1 MACs a point) 0.524 ms against 0.703; the same with k=4 (24.0) 0.758 against 0.744,
  // with k=5 (46.9) 0.645 against 0.366.
  if (info.macs_per_point > kConvTSumsMaxMacs) {
    return refuse(fmt::format("{:.1f} MACs a point to recompute u (at most {})",
                              info.macs_per_point, kConvTSumsMaxMacs));
  }
  ConvTTune t = ChooseConvTTune(info, target);
  // A lane holds grad_y's values of its unit beside the accumulators: twice as many registers.
  const int64_t regs = 2 * ConvTAccumulators(info, t) + kRegisterOverhead;
  if (regs > RegisterCap(t.threads, t.min_blocks)) t.min_blocks = 1;
  if (regs > RegisterCap(t.threads, t.min_blocks)) {
    return refuse(absl::StrCat(regs, " registers a lane"));
  }
  const TuneConfig config =
      ToConfig("convt-recompute-normalize", t, std::span<const TuneField<ConvTTune>>(kConvTFields));
  if (absl::Status s = CheckConvT(chain, info, target, t, config, ConvTPasses::kStatsOnly);
      !s.ok()) {
    return refuse(std::string(s.message()));
  }
  ConvTSums out;
  out.blocks_per_sample = t.stat_blocks;
  out.tune = ToTuneStruct("ConvTTune", t, std::span<const TuneField<ConvTTune>>(kConvTFields));
  KernelLaunch& k = out.launch;
  k.symbol = "fj_convt_bwd_sums";
  k.body = "fj::convt_bwd_sums_kernel<Cfg, ConvTTune, BwdTune>";
  k.purpose = absl::StrCat("g_h = grad_y * post'(h) on u recomputed (conv_transpose3d by phase, ",
                           fmt::format("{:.1f}", info.macs_per_point),
                           " MACs a point), not read: sums of g_h and g_h*zhat per (n, c, block)");
  k.grid = {static_cast<unsigned>(t.stat_blocks), static_cast<unsigned>(info.producer_shape[0]), 1};
  k.block = {static_cast<unsigned>(t.threads), 1, 1};
  k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
  k.shared_bytes = static_cast<unsigned>(ConvTDynamicSharedBytes(chain, info));
  k.args = ProducerArgs(info);
  return out;
}

std::unique_ptr<Strategy> MakeConvTDirectStrategy() {
  return std::make_unique<ConvTDirectStrategy>();
}
std::unique_ptr<Strategy> MakeConvTRecomputeStrategy() {
  return std::make_unique<ConvTStrategy>(/*store=*/false);
}
std::unique_ptr<Strategy> MakeConvTStoreStrategy() {
  return std::make_unique<ConvTStrategy>(/*store=*/true);
}

}  // namespace fusejit::codegen
