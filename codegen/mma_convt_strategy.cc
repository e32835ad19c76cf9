// The tensor-core transposed-convolution strategies (templates/mma_convt.cuh): conv_transpose3d
// with a bias, at most 16 input and 32 output channels, split by output phase and computed with
// mma.sync m16n8k16 (fp32-accurate F16x3 split; bf16/f16 chains one fp16 product), one warp per
// output row, input planes channels-last fp16 in shared memory:
//   mma-convt-recompute-normalize  conv_transpose3d | ew* | group_norm | ew* (seed W1): a
//       statistics pass and a writing pass both recompute the convolution (as
//       convt-recompute-normalize, whose FFMA loops it replaces); y written once.
//   mma-convt-direct               conv_transpose3d | ew* (W1's convolution alone, which its
//       backward's training forward runs): one pass writing y (and u).
// Tunable: warps per block, min blocks per SM, blocks per sample of each pass (chunks of output
// depth phases).
#include <algorithm>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/planner.h"
#include "codegen/strategy_util.h"
#include "templates/geometry.cuh"

namespace fusejit::codegen {
namespace {

struct MmaConvTTune {
  int64_t warps = 8, min_blocks = 2, stat_blocks = 2, write_blocks = 2;
};

// Config text <-> constants (mma_convt.cuh's MmaConvTDefaultTune).
constexpr TuneField<MmaConvTTune> kRecomputeFields[] = {
    {"warps", "kWarps", &MmaConvTTune::warps},
    {"min_blocks", "kMinBlocksPerSM", &MmaConvTTune::min_blocks},
    {"stat_blocks", "kStatBlocksPerSample", &MmaConvTTune::stat_blocks},
    {"write_blocks", "kWriteBlocksPerSample", &MmaConvTTune::write_blocks},
};
// The direct plan has no statistics pass (kStatBlocksPerSample keeps its default, unused).
constexpr TuneField<MmaConvTTune> kDirectFields[] = {
    {"warps", "kWarps", &MmaConvTTune::warps},
    {"min_blocks", "kMinBlocksPerSM", &MmaConvTTune::min_blocks},
    {"write_blocks", "kWriteBlocksPerSample", &MmaConvTTune::write_blocks},
};

struct MmaConvTGeometry : fj::geom::MmaConvT {
  int64_t registers = 0;  // a rough per-thread estimate
  int64_t depth_q = 0;    // output depths per d phase: ceil(D / SD), the blocks' chunks
};

MmaConvTGeometry Geometry(const Chain& chain, const ChainInfo& info, const MmaConvTTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  MmaConvTGeometry g;
  static_cast<fj::geom::MmaConvT&>(g) = fj::geom::MmaConvTOf(
      chain.input[1], chain.input[3], info.producer_shape[1], info.producer_shape[4],
      conv.kernel[0], conv.kernel[1], conv.kernel[2], conv.stride[0], conv.stride[2],
      conv.padding[0], conv.padding[2], conv.dilation[0], conv.dilation[2], t.warps,
      /*split=*/chain.dtype == DType::kF32);
  // ptxas (sm_90, CUDA 12): 76-80 registers for W1's (SW 2, 2 x 2 tiles).
  g.registers = 36 + g.accumulators + 4 * g.nt + conv.stride[2] * g.ks;
  g.depth_q = (info.producer_shape[2] + conv.stride[0] - 1) / conv.stride[0];
  return g;
}

// Which passes a plan runs.
enum class Passes { kBoth, kWriteOnly };

// Mirrors mma_convt.cuh's static_asserts, plus registers, shared memory per SM and grid.
absl::Status CheckMmaConvT(const Chain& chain, const ChainInfo& info, const MmaConvTTune& t,
                           const PlanTarget& target, const TuneConfig& c, Passes passes) {
  if (!HasAmpereFeatures(target.arch)) {
    return Invalid(c, absl::StrCat("mma.sync needs sm_80 or later (target ", target.arch, ")"));
  }
  if (t.warps < 1 || t.warps > 32) return Invalid(c, "warps must be in [1, 32]");
  if (absl::Status s = CheckBlock(c, 32 * t.warps, t.min_blocks); !s.ok()) return s;
  if (chain.input[1] > 16 || info.producer_shape[1] > 32) {
    return Invalid(c, absl::StrCat(chain.input[1], " input and ", info.producer_shape[1],
                                   " output channels: at most 16 and 32"));
  }
  const MmaConvTGeometry g = Geometry(chain, info, t);
  if (g.ks > 4) {
    return Invalid(c, absl::StrCat("a w phase's taps x input channels (padded to 4): ", g.ks * 16,
                                   " padded, at most 64"));
  }
  if (g.accumulators > 64) {
    return Invalid(c, absl::StrCat(g.accumulators,
                                   " accumulators per thread (w stride x m16 "
                                   "tiles of a phase row x n8 tiles x 4): at most 64"));
  }
  for (auto [what, v] :
       {std::pair{"stat_blocks", t.stat_blocks}, {"write_blocks", t.write_blocks}}) {
    if (passes == Passes::kWriteOnly && std::string_view(what) == "stat_blocks") continue;
    if (v < 1 || v > g.depth_q) {
      return Invalid(c, absl::StrCat(what, " ", v, " must be in [1, ", g.depth_q,
                                     "] (output depths per depth phase)"));
    }
  }
  return CheckResidency(c, g.shared_bytes, 32 * t.warps, t.min_blocks, g.registers,
                        info.producer_shape[0], target.arch);
}

// Blocks per sample for n samples of dq output depths (per depth phase) on `slots` resident
// blocks: the fewest that fill 90% of the slots, each with work (a chunk of ceil(dq / b) depths
// gives ceil(dq / chunk) blocks). W1, 128 samples of 16 depths: 2 blocks of 8 depths, 256
// blocks on 264 slots; 3 blocks (chunks of 6, 6 and 4) took 1.45 waves.
int64_t BalancedBlocks(int64_t n, int64_t dq, int64_t slots) {
  for (int64_t b = 1; b <= dq; ++b) {
    const int64_t chunk = (dq + b - 1) / b, used = (dq + chunk - 1) / chunk;
    if (n * used >= slots * 9 / 10) return used;
  }
  return dq;
}

// 8 warps (4 where that fits more warps on an SM), as many blocks an SM as fit (at most 4), and
// blocks per sample filling one wave of the device.
MmaConvTTune DefaultTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target) {
  MmaConvTTune best;
  int64_t best_warps = -1;
  for (int64_t warps : {8, 4}) {
    MmaConvTTune t;
    t.warps = warps;
    const MmaConvTGeometry g = Geometry(chain, info, t);
    const int64_t limit = SharedOptInLimit(target.arch);
    const int64_t by_smem = (limit + 1024) / (g.shared_bytes + 1024);
    const int64_t by_regs = 65536 / (32 * warps * std::max<int64_t>(64, (g.registers + 7) / 8 * 8));
    t.min_blocks = std::clamp<int64_t>(std::min({by_smem, by_regs, 2048 / (32 * warps)}), 1, 4);
    t.stat_blocks = t.write_blocks =
        BalancedBlocks(info.producer_shape[0], g.depth_q, target.sm_count * t.min_blocks);
    if (t.warps * t.min_blocks > best_warps) {
      best_warps = t.warps * t.min_blocks;
      best = t;
    }
  }
  return best;
}

std::vector<TuneParam> TuneSpaceOf(const PlanInput& in, bool stats) {
  const MmaConvTTune t = DefaultTune(in.chain, in.info, in.target);
  const int64_t dq = Geometry(in.chain, in.info, t).depth_q;
  std::vector<int64_t> bps =
      BlocksPerSampleCandidates(t.write_blocks, in.info.producer_shape[0], in.target);
  bps.push_back(t.write_blocks);
  for (int64_t& b : bps) b = std::clamp<int64_t>(b, 1, dq);
  std::sort(bps.begin(), bps.end());
  bps.erase(std::unique(bps.begin(), bps.end()), bps.end());
  std::vector<TuneParam> space = {{"warps", {4, 8, 16}}, {"min_blocks", {1, 2, 3, 4}}};
  if (stats) space.push_back({"stat_blocks", bps});
  space.push_back({"write_blocks", bps});
  return space;
}

// Where these kernels were measured faster than the FFMA convt-* kernels and tc-conv (H100,
// 2026-11-27, `fusejit bench --strategy`, bench/notes/mma_convt_2026-11-27.txt): a strided
// transposed convolution whose output phases have few taps (kernel^3 / stride^3 <= 4 on
// average) over at least 4 input channels, with whole n8 tiles of outputs, rows of 32 or more
// points and a block an SM.
//   [16,16,16,32,32] k3 s2 -> 16 | relu | group_norm: 0.284 ms (bf16 0.205) against tc-conv
//       0.506 (0.339) and convt-recompute-normalize 0.406 (0.411);
//   [32,4,16,24,24] k2 s2 -> 32 | group_norm: 0.197 (0.177) against 0.225 (0.215) and tc-conv
//   0.593.
// Slower elsewhere: W1 (3 input channels: 1.152 ms against the FFMA kernels' 1.069; bf16 0.951
// against 0.891), stride 1 ([8,8,16,32,32] k3 -> 32: 0.190 against tc-conv's 0.102;
// [16,16,12,24,24] k3 -> 8: 0.110 against 0.080) and phases of 8 taps ([16,8,16^3] k4 s2 -> 24
// | swish: 0.104 against tc-conv's 0.091) -- the GEMM engine's K is long enough there, and with 3
// channels the F16x3 products and their operand loads cost as much as the FFMA loops.
bool MeasuredDomain(const Chain& chain, const ChainInfo& info, const PlanTarget& target) {
  const ConvAttrs& conv = info.producer->conv;
  // Parallelism is samples x output depths per phase (a block's rows): below one block an SM,
  // tc-conv's tiles win ([8,12,8,16,16] k3 s2 -> 20 | swish | group_norm | relu: 0.107 ms
  // against 0.051).
  const int64_t dq = (info.producer_shape[2] + conv.stride[0] - 1) / conv.stride[0];
  if (info.producer_shape[0] * dq < target.sm_count) return false;
  // Whole n8 tiles and output rows of at least 32 points: T7 of the sweep ([32,12,12^3] k3 s2 ->
  // 18, rows of 25) took 0.189 ms against tc-conv's 0.160 and the FFMA kernels' 0.169.
  if (info.producer_shape[1] % 8 != 0 || info.producer_shape[4] < 32) return false;
  double taps = 1.0;
  bool strided = false;
  for (int i = 0; i < 3; ++i) {
    taps *= static_cast<double>(conv.kernel[i]) / static_cast<double>(conv.stride[i]);
    strided = strided || conv.stride[i] > 1;
  }
  return strided && taps <= 4.0 && chain.input[1] >= 4;
}

// The planner's cost: below every other applicable strategy's where measured faster (0.8 x the
// lowest), above it elsewhere (2 x: reached by --strategy, a tuned config or `fusejit autotune`).
// The other strategies' models are not calibrated well enough here to compare a fitted time
// with (convt-recompute-normalize's estimates W1 at 0.27 ms; it takes 1.07).
double RelativeCost(const PlanInput& in, std::string_view self, bool measured_domain) {
  double lowest = 0.0;
  for (const auto& s : AllStrategies()) {
    if (s->name() == self || s->name().rfind("mma-convt", 0) == 0) continue;
    if (!StrategyApplies(*s, in.chain, in.target)) continue;
    const double c = s->Cost(in);
    lowest = lowest == 0.0 ? c : std::min(lowest, c);
  }
  if (lowest == 0.0) lowest = static_cast<double>(in.info.elements) * 10.0;  // none applies
  return (measured_domain ? 0.8 : 2.0) * lowest;
}

bool InDomain(const PlanInput& in, bool with_norm) {
  if (!HasAmpereFeatures(in.target.arch)) return false;
  const ChainInfo& info = in.info;
  return info.producer && info.producer->kind == OpKind::kConvTranspose3d &&
         info.producer->conv.bias && (info.group_norm != nullptr) == with_norm &&
         info.mean == MeanMode::kNone;
}

// What both share: the template, its dtypes, products and description.
class MmaConvTStrategyBase : public Strategy {
 public:
  // x and the parameters read as the chain's dtype (the F16x3 split takes any float; 16-bit
  // values take one fp16 product), y rounded once: bf16 and f16 chains run natively.
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    if (config.strategy != name()) {
      return Invalid(config, absl::StrCat("not a ", std::string(name()), " config"));
    }
    absl::StatusOr<MmaConvTTune> t = FromConfig(config, Fields());
    if (!t.ok()) return t.status();
    return CheckMmaConvT(in.chain, in.info, *t, in.target, config, PassesRun());
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), DefaultTune(in.chain, in.info, in.target), Fields());
  }

 protected:
  virtual std::span<const TuneField<MmaConvTTune>> Fields() const = 0;
  virtual Passes PassesRun() const = 0;
  bool Fits(const PlanInput& in) const {
    const MmaConvTTune t = DefaultTune(in.chain, in.info, in.target);
    return CheckMmaConvT(in.chain, in.info, t, in.target, ToConfig(name(), t, Fields()),
                         PassesRun())
        .ok();
  }
  static std::string Products(const Chain& chain) {
    return chain.dtype == DType::kF32 ? "F16x3" : "one fp16 product of the 16-bit values";
  }
  static std::string Description(const Chain& chain, const std::string& rest) {
    return absl::StrCat(
        "transposed conv split by output phase on tensor cores (mma.sync m16n8k16, ",
        chain.dtype == DType::kF32 ? "fp32-accurate F16x3 split" : Products(chain),
        "), input planes channels-last fp16 in shared memory, one warp per output row; ", rest);
  }
  KernelLaunch PassLaunch(const PlanInput& in, const MmaConvTTune& t, int64_t blocks) const {
    KernelLaunch k;
    k.grid = {static_cast<unsigned>(blocks), static_cast<unsigned>(in.info.producer_shape[0]), 1};
    k.block = {static_cast<unsigned>(32 * t.warps), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    // MmaConvTGeom::kSharedBytes
    k.shared_bytes = static_cast<unsigned>(Geometry(in.chain, in.info, t).shared_bytes);
    k.args = ProducerArgs(in.info);
    return k;
  }
};

class MmaConvTRecomputeStrategy : public MmaConvTStrategyBase {
 public:
  std::string_view name() const override { return "mma-convt-recompute-normalize"; }
  bool Applies(const PlanInput& in) const override { return InDomain(in, true) && Fits(in); }
  double Cost(const PlanInput& in) const override {
    return RelativeCost(in, name(), MeasuredDomain(in.chain, in.info, in.target));
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    return TuneSpaceOf(in, /*stats=*/true);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const MmaConvTTune t = *FromConfig(config, Fields());
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.description = Description(
        in.chain,
        "pass 1 recomputes it for group moments without writing, pass 2 recomputes, normalizes "
        "and writes y once with coalesced stores");
    plan.includes = {"mma_convt.cuh"};
    plan.tunes.push_back(ToTuneStruct("MmaConvTTune", t, Fields()));
    const size_t partials =
        plan.AddWorkspace("per-block group moments x N*stat_blocks*groups",
                          static_cast<size_t>(n * t.stat_blocks * info.group_norm->groups) * 12);
    const size_t scale_shift =
        plan.AddWorkspace("per-channel (scale, shift) x N*C", static_cast<size_t>(n * c) * 8);
    KernelLaunch k1 = PassLaunch(in, t, t.stat_blocks);
    k1.symbol = "fj_mma_convt_moments";
    k1.body = "fj::mma_convt_moments<Cfg, MmaConvTTune>";
    k1.purpose = absl::StrCat("conv_transpose3d by phase (tensor cores, ", Products(in.chain),
                              ") + pre-ops, per-block group moments");
    k1.args.push_back(KernelArg::Workspace(ArgType::kMoments, "partials", partials, kWrite));
    // Where the kernel stores u for a training forward (codegen::SaveProducerOutput binds it).
    k1.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    plan.kernels.push_back(k1);
    plan.kernels.push_back(GroupNormScaleShiftLaunch(info, "MmaConvTTune", partials, scale_shift));
    KernelLaunch k3 = PassLaunch(in, t, t.write_blocks);
    k3.symbol = "fj_mma_convt_write";
    k3.body = "fj::mma_convt_norm_write<Cfg, MmaConvTTune>";
    k3.purpose = "recompute conv_transpose3d + pre-ops, normalize, post-ops, write y once";
    k3.args.push_back(KernelArg::Workspace(ArgType::kFloat2, "scale_shift", scale_shift, kRead));
    k3.args.push_back(KernelArg::Output());
    plan.kernels.push_back(k3);
    return plan;
  }

 protected:
  std::span<const TuneField<MmaConvTTune>> Fields() const override { return kRecomputeFields; }
  Passes PassesRun() const override { return Passes::kBoth; }
};

class MmaConvTDirectStrategy : public MmaConvTStrategyBase {
 public:
  std::string_view name() const override { return "mma-convt-direct"; }
  bool Applies(const PlanInput& in) const override { return InDomain(in, false) && Fits(in); }
  // Not yet measured faster than convt-direct or tc-conv on any chain ([16,8,16,24,24] k2 s2 ->
  // 16 | gelu: 0.074 ms against convt-direct's 0.058 and tc-conv's 0.079; bf16 0.071 against
  // 0.058 and 0.065): the planner leaves it to --strategy, tuned configs and `fusejit autotune`.
  double Cost(const PlanInput& in) const override {
    return RelativeCost(in, name(), /*measured_domain=*/false);
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    return TuneSpaceOf(in, /*stats=*/false);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const MmaConvTTune t = *FromConfig(config, Fields());
    Plan plan;
    plan.strategy = std::string(name());
    plan.description = Description(in.chain, "the ops applied and y written once");
    plan.includes = {"mma_convt.cuh"};
    plan.tunes.push_back(ToTuneStruct("MmaConvTTune", t, Fields()));
    KernelLaunch k = PassLaunch(in, t, t.write_blocks);
    k.symbol = "fj_mma_convt_direct";
    k.body = "fj::mma_convt_direct<Cfg, MmaConvTTune>";
    k.purpose = absl::StrCat("conv_transpose3d by phase (tensor cores, ", Products(in.chain),
                             ") + the ops, write y once");
    k.args.push_back(KernelArg::Output());
    // Where the kernel stores u for a training forward (codegen::SaveProducerOutput binds it).
    k.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    plan.kernels.push_back(k);
    return plan;
  }

 protected:
  std::span<const TuneField<MmaConvTTune>> Fields() const override { return kDirectFields; }
  Passes PassesRun() const override { return Passes::kWriteOnly; }
};

}  // namespace

std::unique_ptr<Strategy> MakeMmaConvTRecomputeStrategy() {
  return std::make_unique<MmaConvTRecomputeStrategy>();
}
std::unique_ptr<Strategy> MakeMmaConvTDirectStrategy() {
  return std::make_unique<MmaConvTDirectStrategy>();
}

}  // namespace fusejit::codegen
