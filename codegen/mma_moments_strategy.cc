// mma-moments-mean: conv3d | ew* | group_norm | mean on tensor cores (seeds W2, W4); and
// mma-direct: conv3d | ew* with the same convolution, y written once.
// templates/mma_conv_moments.cuh + moments_mean.cuh: the same per-block per-channel moments as
// conv-moments-mean (the mean of an affine group_norm output follows from them), computed with
// mma.sync m16n8k16 (fp16 inputs, fp32 accumulate, sm_80+) in the fp32-accurate F16x3 split;
// input planes staged channels-last in shared memory as fp16 hi/lo, weights as B fragments.
// Tunable: warps per block, min blocks per SM, blocks per sample (od chunks), kh unrolling,
// K packing over the whole kernel (one input scale per block).
#include <algorithm>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"
#include "templates/geometry.cuh"

namespace fusejit::codegen {
namespace {

struct MmaMomentsTuneValues {
  int64_t warps = 8, min_blocks = 2, blocks_per_sample = 1, unroll_kh = 1, pack = 0;
};

// Config text <-> constants (the fields of mma_conv_moments.cuh's MmaMomentsTune).
constexpr TuneField<MmaMomentsTuneValues> kMmaMomentsFields[] = {
    {"warps", "kWarps", &MmaMomentsTuneValues::warps},
    {"min_blocks", "kMinBlocksPerSM", &MmaMomentsTuneValues::min_blocks},
    {"blocks_per_sample", "kBlocksPerSample", &MmaMomentsTuneValues::blocks_per_sample},
    {"unroll_kh", "kUnrollKH", &MmaMomentsTuneValues::unroll_kh},
    {"pack", "kPack", &MmaMomentsTuneValues::pack},
};

// The template's compile-time shape (MmaMomentsGeom): the same function, templates/geometry.cuh;
// plus a register estimate.
struct MmaMomentsGeometry : fj::geom::MmaMoments {
  int64_t registers = 0;  // a rough per-thread estimate
};

MmaMomentsGeometry MmaGeom(const Chain& chain, const ChainInfo& info,
                           const MmaMomentsTuneValues& t) {
  const ConvAttrs& conv = info.producer->conv;
  MmaMomentsGeometry g;
  static_cast<fj::geom::MmaMoments&>(g) = fj::geom::MmaMomentsOf(
      chain.input[1], chain.input[3], info.producer_shape[1], info.producer_shape[4],
      conv.kernel[0], conv.kernel[1], conv.kernel[2], conv.stride[2], conv.dilation[0],
      conv.dilation[2], t.warps, t.pack != 0);
  // Fitted to ptxas (sm_90, CUDA 12): 90 registers for W2 (2 x 2 tiles), 117 for W4 (2 x 3).
  // Unrolling kh keeps more fragments live (W2 with 2: 128, no spills; W4 with 2 spilled at 128).
  g.registers = 40 + 14 * g.mt * g.nt + (t.unroll_kh > 1 ? 6 * g.mt * g.nt : 0);
  return g;
}

bool ArchHasMma(const std::string& arch) {
  return arch.rfind("sm_8", 0) == 0 || arch.rfind("sm_9", 0) == 0;
}

// Mirrors mma_conv_moments.cuh's static_asserts, plus registers, shared memory per SM and grid.
absl::Status CheckMma(const Chain& chain, const ChainInfo& info, const MmaMomentsTuneValues& t,
                      const PlanTarget& target, const TuneConfig& c) {
  if (!ArchHasMma(target.arch)) {
    return Invalid(c, absl::StrCat("mma.sync needs sm_80 or sm_90 (target ", target.arch, ")"));
  }
  if (t.warps < 1 || t.warps > 32) return Invalid(c, "warps must be in [1, 32]");
  if (absl::Status s = CheckBlock(c, 32 * t.warps, t.min_blocks); !s.ok()) return s;
  const int64_t ch = info.producer_shape[1];
  if (ch % 8 != 0 || ch > 32) {
    return Invalid(c, absl::StrCat(ch, " channels: a multiple of 8, at most 32"));
  }
  const MmaMomentsGeometry g = MmaGeom(chain, info, t);
  if (g.mt > 4) {
    return Invalid(c, absl::StrCat("output rows of ", info.producer_shape[4], " points: at most 64"));
  }
  if (g.ks > 4) {
    return Invalid(c, absl::StrCat("kernel width x input channels (padded to 4) ",
                                   info.producer->conv.kernel[2] * g.cinp, ": at most 64"));
  }
  if (t.unroll_kh < 1 || t.unroll_kh > info.producer->conv.kernel[1]) {
    return Invalid(c, absl::StrCat("unroll_kh ", t.unroll_kh, " must be in [1, ",
                                   info.producer->conv.kernel[1], "] (kernel height)"));
  }
  if (t.pack != 0 && t.pack != 1) return Invalid(c, "pack must be 0 or 1");
  if (t.pack == 1 && (info.producer->conv.padding[0] != 0 || info.producer->conv.padding[1] != 0 ||
                      g.ksp > 16)) {
    return Invalid(c, absl::StrCat("pack 1 needs no depth/height padding and at most 16 packed "
                                   "k16 steps (", g.ksp, ")"));
  }
  const int64_t d = info.producer_shape[2];
  if (t.blocks_per_sample < 1 || t.blocks_per_sample > d) {
    return Invalid(c, absl::StrCat("blocks_per_sample ", t.blocks_per_sample, " must be in [1, ",
                                   d, "] (output depth)"));
  }
  return CheckResidency(c, g.shared_bytes, 32 * t.warps, t.min_blocks, g.registers,
                        info.producer_shape[0], target.arch);
}

// Where this strategy was measured faster than conv-moments-mean (H100, 2026-11-22, `fusejit
// bench --strategy`): unit stride and dilation, no padding, kernels of at least 3 taps in every
// dimension, at most 8 input and 32 output channels -- the seeds W2 (1.245 vs 1.981 ms) and W4
// (0.220 vs 0.286) and the sweep's W2-a 0.037 vs 0.054, W2-b 0.328 vs 0.541, W2-c 0.104 vs
// 0.129, W2-d (8 input channels, k5) 0.106 vs 0.134, W4-a 0.033 vs 0.043, W4-b 0.160 vs 0.196,
// W4-d 0.178 vs 0.299. Slower outside it: W2-e (k=1) 0.046 vs 0.042, W4-c (stride 2) 0.106 vs
// 0.069.
bool MeasuredDomain(const Chain& chain, const ChainInfo& info) {
  const ConvAttrs& conv = info.producer->conv;
  for (int i = 0; i < 3; ++i) {
    if (conv.stride[i] != 1 || conv.dilation[i] != 1 || conv.padding[i] != 0) return false;
    if (conv.kernel[i] < 3) return false;
  }
  return chain.input[1] <= 8 && info.producer_shape[1] <= 32;
}

// 8 warps (4 when registers or shared memory leave room for more blocks that way), as many
// blocks per SM as fit (at most 4), and blocks per sample filling one wave of the device.
MmaMomentsTuneValues DefaultMmaTune(const Chain& chain, const ChainInfo& info,
                                    const PlanTarget& target) {
  MmaMomentsTuneValues best;
  int64_t best_warps = -1;
  for (int64_t warps : {8, 4}) {
    MmaMomentsTuneValues t;
    t.warps = warps;
    const MmaMomentsGeometry g = MmaGeom(chain, info, t);
    const int64_t limit = SharedOptInLimit(target.arch);
    const int64_t by_smem = (limit + 1024) / (g.shared_bytes + 1024);
    const int64_t by_regs = 65536 / (32 * warps * std::max<int64_t>(64, (g.registers + 7) / 8 * 8));
    t.min_blocks = std::clamp<int64_t>(std::min({by_smem, by_regs, 2048 / (32 * warps)}), 1, 4);
    const int64_t n = info.producer_shape[0];
    t.blocks_per_sample = std::clamp<int64_t>(target.sm_count * t.min_blocks / n, 1,
                                              info.producer_shape[2]);
    // Packing K over the whole kernel where it saves k16 steps (W4: 7 instead of 9 per row);
    // else kh unrolled twice where the registers allow it (W2: 1.20-1.23 vs 1.33 ms; W4 with
    // pack: 0.203 vs 0.235 ms per RunOnGpu median).
    MmaMomentsTuneValues p = t;
    p.pack = 1;
    const MmaMomentsGeometry pg = MmaGeom(chain, info, p);
    if (pg.ksp < info.producer->conv.kernel[0] * info.producer->conv.kernel[1] * pg.ks &&
        CheckMma(chain, info, p, target, TuneConfig{}).ok()) {
      t = p;
    } else if (info.producer->conv.kernel[1] >= 2) {
      MmaMomentsTuneValues u = t;
      u.unroll_kh = 2;
      if (CheckMma(chain, info, u, target, TuneConfig{}).ok()) t = u;
    }
    if (t.warps * t.min_blocks > best_warps) {
      best_warps = t.warps * t.min_blocks;
      best = t;
    }
  }
  return best;
}

// bf16 / f16 chains take one fp16 product per k-step instead of three (templates/
// mma_conv_moments.cuh): W2 in bf16 took 0.720 ms against 1.245 in f32 (H100, 2026-11-27).
double SixteenBitFactor(const Chain& chain) { return chain.dtype == DType::kF32 ? 1.0 : 0.58; }

// The launch configurations mma-moments-mean and mma-direct search (`fusejit autotune`).
std::vector<TuneParam> MmaTuneSpace(const PlanInput& in) {
  const ChainInfo& info = in.info;
  const MmaMomentsTuneValues t = DefaultMmaTune(in.chain, info, in.target);
  std::vector<int64_t> bps =
      BlocksPerSampleCandidates(t.blocks_per_sample, info.producer_shape[0], in.target);
  bps.push_back(t.blocks_per_sample);
  for (int64_t& b : bps) b = std::min<int64_t>(b, info.producer_shape[2]);
  std::sort(bps.begin(), bps.end());
  bps.erase(std::unique(bps.begin(), bps.end()), bps.end());
  std::vector<int64_t> unroll = {1, 2};
  if (info.producer->conv.kernel[1] > 2) unroll.push_back(info.producer->conv.kernel[1]);
  return {{"warps", {4, 8, 16}},
          {"min_blocks", {1, 2, 3, 4}},
          {"blocks_per_sample", bps},
          {"unroll_kh", unroll},
          {"pack", {0, 1}}};
}

// Validate of mma-moments-mean and mma-direct (one template, one geometry check).
absl::Status ValidateMma(std::string_view strategy, const PlanInput& in, const TuneConfig& config) {
  if (config.strategy != strategy) {
    return Invalid(config, absl::StrCat("not a ", std::string(strategy), " config"));
  }
  absl::StatusOr<MmaMomentsTuneValues> t =
      FromConfig(config, std::span<const TuneField<MmaMomentsTuneValues>>(kMmaMomentsFields));
  if (!t.ok()) return t.status();
  return CheckMma(in.chain, in.info, *t, in.target, config);
}

// What mma-moments-mean and mma-direct share: one kernel template (templates/
// mma_conv_moments.cuh), its dtypes, launch configurations and their validation.
class MmaConvStrategy : public Strategy {
 public:
  // The kernels read x and the parameters as the chain's dtype (converted as they are loaded:
  // the F16x3 split takes any float; 16-bit values take one fp16 product) and round y once:
  // bf16 and f16 chains run natively.
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), DefaultMmaTune(in.chain, in.info, in.target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override { return MmaTuneSpace(in); }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    return ValidateMma(name(), in, config);
  }

 protected:
  static std::span<const TuneField<MmaMomentsTuneValues>> Fields() { return kMmaMomentsFields; }
  // How the kernel forms its products for `chain`'s dtype (explain and the kernel's comment).
  static std::string Products(const Chain& chain) {
    return chain.dtype == DType::kF32 ? "F16x3" : "one fp16 product of the 16-bit values";
  }
  static std::string Description(const Chain& chain, const std::string& rest) {
    return absl::StrCat("conv3d on tensor cores (mma.sync m16n8k16, ",
                        chain.dtype == DType::kF32 ? "fp32-accurate F16x3 split" : Products(chain),
                        "), input planes channels-last fp16 in shared memory, one warp per "
                        "output row; ",
                        rest);
  }
};

class MmaMomentsMeanStrategy : public MmaConvStrategy {
 public:
  std::string_view name() const override { return "mma-moments-mean"; }
  bool Applies(const PlanInput& in) const override {
    if (!HasAmpereFeatures(in.target.arch)) return false;  // cp.async, mma.sync
    const ChainInfo& info = in.info;
    if (!info.producer || info.producer->kind != OpKind::kConv3d || !info.producer->conv.bias ||
        !info.group_norm || info.mean == MeanMode::kNone || !info.post_ops.empty()) {
      return false;
    }
    const MmaMomentsTuneValues t = DefaultMmaTune(in.chain, info, in.target);
    return CheckMma(in.chain, info, t, in.target, ToConfig(name(), t, Fields())).ok();
  }
  // Half of conv-moments-mean's cost in MeasuredDomain, so the planner picks it there; twice it
  // elsewhere (measured slower or not measured: reached by --strategy, a tuned config or
  // `fusejit autotune`).
  double Cost(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const double ffma = static_cast<double>(info.elements) * 2.0 * info.macs_per_point / 50.0;
    if (!MeasuredDomain(in.chain, info)) return 2.0 * ffma;
    // conv-moments-mean's modeled time is a fitted time model outside its seed domain: stay
    // below it.
    return 0.5 * std::min(ffma, ConvMomentsModeledCost(in)) * SixteenBitFactor(in.chain);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const MmaMomentsTuneValues t = *FromConfig(config, Fields());
    const MmaMomentsGeometry g = MmaGeom(in.chain, info, t);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.description = Description(
        in.chain,
        "per-block per-channel moments of the pre-norm values; the mean of the affine group_norm "
        "output follows from them: nothing full-size stored");
    plan.includes = {"mma_conv_moments.cuh", "moments_mean.cuh"};
    plan.tunes.push_back(ToTuneStruct("MmaMomentsTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-block channel moments (count, mean, M2) x N*blocks_per_sample*C",
        static_cast<size_t>(n * t.blocks_per_sample * c) * 12);
    KernelLaunch k;
    k.symbol = "fj_mma_conv_moments";
    k.body = "fj::mma_conv_moments<Cfg, MmaMomentsTune>";
    k.purpose = absl::StrCat("conv3d (tensor cores, ", Products(in.chain),
                             ") + pre-ops, per-block per-channel moments");
    k.grid = {static_cast<unsigned>(t.blocks_per_sample), static_cast<unsigned>(n), 1};
    k.block = {static_cast<unsigned>(32 * t.warps), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k.shared_bytes = static_cast<unsigned>(g.shared_bytes);  // MmaMomentsGeom::kSharedBytes
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Workspace(ArgType::kMoments, "partials", partials, kWrite));
    // Where the kernel stores u for a training forward (codegen::SaveProducerOutput binds it).
    k.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    plan.kernels.push_back(k);
    plan.kernels.push_back(
        MomentsMeanFinalizeLaunch(info, "MmaMomentsTune", ArgType::kMoments, partials));
    return plan;
  }
};

// mma-direct: conv3d | ew* (no group_norm, no mean) with mma-moments-mean's convolution, each
// row's y = ops(acc + bias) written once in the chain's dtype (and u in a training forward).
// Before it these chains ran tc-conv (3xTF32 GEMM over 3 input channels: W2's composite training
// forward, its convolution alone on tc-conv then the ops from u, took 4.16 ms against
// mma-moments-mean's fused 1.29, H100, 2026-11-26).
class MmaDirectStrategy : public MmaConvStrategy {
 public:
  std::string_view name() const override { return "mma-direct"; }
  bool Applies(const PlanInput& in) const override {
    if (!HasAmpereFeatures(in.target.arch)) return false;  // cp.async, mma.sync
    const ChainInfo& info = in.info;
    if (!info.producer || info.producer->kind != OpKind::kConv3d || !info.producer->conv.bias ||
        info.group_norm || info.mean != MeanMode::kNone) {
      return false;
    }
    const MmaMomentsTuneValues t = DefaultMmaTune(in.chain, info, in.target);
    return CheckMma(in.chain, info, t, in.target, ToConfig(name(), t, Fields())).ok();
  }
  // A time model fitted to four chains (H100, 2026-11-27, bench/notes/mma_direct_2026-11-27.txt:
  // W2's convolution | hardswish 1.265 ms, 24 outputs with padding 0.849, 32 outputs with k 5
  // stride 2 0.119, 8 outputs on 5 channels 0.040; tc-conv took 1.5-3x as long on each):
  // 33.6 G multiply-adds per ms (half that with a stride, whose rows reuse less of the staged
  // input) and y written at 3 bytes per ps (the small rows' launch and tail, 20-30 us, left out
  // as the other strategies' costs leave it out). bf16 / f16: one fp16 product a step, the
  // products' time x 0.65 (W2's convolution | hardswish in bf16: 0.780 ms).
  double Cost(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const ConvAttrs& conv = info.producer->conv;
    const bool strided = conv.stride[0] > 1 || conv.stride[1] > 1 || conv.stride[2] > 1;
    const double macs = static_cast<double>(info.elements) * info.macs_per_point;
    const double elem_bytes = in.chain.dtype == DType::kF32 ? 4.0 : 2.0;
    return macs / 33.6 * (strided ? 2.0 : 1.0) * (in.chain.dtype == DType::kF32 ? 1.0 : 0.65) +
           static_cast<double>(info.elements) * elem_bytes / 3.0;
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const MmaMomentsTuneValues t = *FromConfig(config, Fields());
    const MmaMomentsGeometry g = MmaGeom(in.chain, info, t);
    Plan plan;
    plan.strategy = std::string(name());
    plan.description = Description(in.chain, "the ops applied and y written once");
    plan.includes = {"mma_conv_moments.cuh"};
    plan.tunes.push_back(ToTuneStruct("MmaMomentsTune", t, Fields()));
    KernelLaunch k;
    k.symbol = "fj_mma_conv_direct";
    k.body = "fj::mma_conv_direct<Cfg, MmaMomentsTune>";
    k.purpose =
        absl::StrCat("conv3d (tensor cores, ", Products(in.chain), ") + the ops, write y once");
    k.grid = {static_cast<unsigned>(t.blocks_per_sample),
              static_cast<unsigned>(info.producer_shape[0]), 1};
    k.block = {static_cast<unsigned>(32 * t.warps), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k.shared_bytes = static_cast<unsigned>(g.shared_bytes);  // MmaMomentsGeom::kSharedBytes
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Output());
    // Where the kernel stores u for a training forward (codegen::SaveProducerOutput binds it).
    k.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    plan.kernels.push_back(k);
    return plan;
  }
};

}  // namespace

std::unique_ptr<Strategy> MakeMmaDirectStrategy() { return std::make_unique<MmaDirectStrategy>(); }
std::unique_ptr<Strategy> MakeMmaMomentsMeanStrategy() {
  return std::make_unique<MmaMomentsMeanStrategy>();
}

}  // namespace fusejit::codegen
