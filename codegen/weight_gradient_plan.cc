#include "codegen/weight_gradient_plan.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/strategy_util.h"
#include "fusejit/signature.h"
#include "templates/geometry.cuh"

namespace fusejit::codegen {
namespace {

// Register tile of the weight-gradient GEMM (templates/wgrad.cuh) for `rows` x `cols`: 4 rows per
// thread (float4 shared reads); the smallest row tile holding the rows (up to 64); the column
// tile, and the threads with it, halved while it is more than twice the columns.
struct WgTile {
  int bm, bn, bk, tm, tn, threads;
};
WgTile ChooseWgTile(int64_t rows, int64_t cols) {
  WgTile t = rows >= 48   ? WgTile{64, 128, 16, 4, 8, 256}
             : rows >= 24 ? WgTile{32, 128, 16, 4, 4, 256}
             : rows >= 12 ? WgTile{16, 256, 16, 4, 4, 256}
             : rows >= 6  ? WgTile{8, 256, 8, 4, 4, 128}
                          : WgTile{4, 512, 8, 4, 4, 128};
  while (t.bn / 2 >= cols && t.threads / 2 >= 64) {
    t.bn /= 2;
    t.threads /= 2;
  }
  return t;
}

// The split count (at most max_splits) whose `tiles * splits` blocks fill whole waves of `slots`
// resident blocks best, the fewest when tied.
int64_t FillingSplits(int64_t tiles, int64_t slots, int64_t max_splits) {
  double best = 0;
  int64_t splits = 1;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t blocks = tiles * s;
    const double fill =
        static_cast<double>(blocks) / static_cast<double>(CeilDiv(blocks, slots) * slots);
    if (fill > best + 1e-9) {
      best = fill;
      splits = s;
    }
  }
  return splits;
}

// The mma.sync kernel's block tile (templates/wgrad.cuh WgMmaWarps): the smallest of 16, 32 and
// 64 rows holding the rows; for 64 rows 128 columns, else the multiple of 64 up to 256 that pads
// the columns least (the widest when tied: T is read once per column tile).
WgTile ChooseMmaWgTile(int64_t rows, int64_t cols) {
  if (rows > 32) return WgTile{64, 128, 32, 4, 4, 256};
  int64_t bn = 64;
  for (int64_t b = 64; b <= 256; b += 64) {
    if (CeilDiv(cols, b) * b <= CeilDiv(cols, bn) * bn) bn = b;
  }
  return WgTile{rows > 16 ? 32 : 16, static_cast<int>(bn), 32, 4, 4, 256};
}

constexpr int64_t kMaxPartsBytes = int64_t{512} << 20;

// The halo kernel's tiles (templates/wgrad_halo.cuh) for T with 8 to 32 channels, if its two
// stages fit 110 KiB of shared memory (two blocks per SM). Fewer channels fill less than half of
// a 16-row mma tile: FFMA (wgrad_partial_kernel) is faster there (W1, 3 channels: 1.46 ms
// against 3.30 ms on the halo kernel, H100, 2026-11-26). More than 32 channels: a 64-row halo
// tile measured 1.3-1.7x slower than the per-tap mma kernel's 64-row tile (3 chains with 40-48
// channels, bench/notes/wgrad_halo_tiles_2026-11-26.txt), so those stay there.
struct HaloTile {
  int64_t bm, bn, rh, seg;
  fj::geom::WgradHalo g;
};
constexpr int64_t kHaloSharedLimit = 110 * 1024;

// The relative time of one k-step of one block, fitted to the kernel's times on 30 tilings of
// six chains (B2, S3, K4 and T1 of bench/conv_engine_sweep.py, W2, W4; H100, 2026-11-26, within
// 20%): 60 per 256 values staged (the copy of T's tile and the halo, and their split; the
// kernel is bound by issuing instructions, mostly these: Nsight Compute on W4's, issue 61% busy,
// mma ~6% of the instructions) and 8 per mma instruction of a warp (3 or 1 per 16 x 8 tile and
// 8-point k-slice).
double HaloStepCost(int64_t bm, int64_t bn, const fj::geom::WgradHalo& g, bool prec3) {
  const double staged = static_cast<double>(bm * g.bk + g.halo);
  const double mma = static_cast<double>(g.bk / 8 * (prec3 ? 3 : 1) * (bm / 16) * (bn / 64));
  return 60 * staged / 256 + 8 * mma;
}

// The tile of least estimated time over the grid (column tiles x row tiles x k-steps): column
// tiles of 64 to 256 (wider ones stage T's tile fewer times, at the cost of padded columns),
// width segments of up to 64 points, up to 128 points per k-step. Segments shorter than T's
// rows must be estimated 5% faster to be taken (W2: 16-point segments of its 29-point rows
// measured 7% slower than whole rows, against 3% faster estimated).
std::optional<HaloTile> ChooseHaloTile(const WeightGradient& wg, int64_t n, bool prec3) {
  if (wg.rows > 32 || wg.rows < 8) return std::nullopt;
  const int64_t bm = ChooseMmaWgTile(wg.rows, wg.cols()).bm;  // 16 or 32 rows
  const ConvAttrs& a = wg.conv;
  const int64_t th = wg.t_grid[1], tw = wg.t_grid[2];
  std::optional<HaloTile> best;
  double best_cost = 0;
  for (int64_t bn = 64; bn <= 256; bn += 64) {
    for (int64_t seg_cap : {64, 32, 16, 8}) {
      const int64_t seg = std::min(tw, seg_cap);
      for (int64_t rh = 1; rh <= std::min<int64_t>(th, std::max<int64_t>(1, 128 / seg)); ++rh) {
        const fj::geom::WgradHalo g = fj::geom::WgradHaloOf(
            n, wg.t_grid[0], th, tw, a.kernel[0], a.kernel[1], a.kernel[2], a.stride[1],
            a.stride[2], a.dilation[1], a.dilation[2], wg.s_channels, rh, seg, bm, bn);
        if (g.smem > kHaloSharedLimit) continue;
        const double cost = static_cast<double>(CeilDiv(wg.cols(), bn) * g.steps) *
                            HaloStepCost(bm, bn, g, prec3) *
                            (seg == std::min<int64_t>(tw, 64) ? 1.0 : 1.05);
        if (!best || cost < best_cost) {
          best = HaloTile{bm, bn, rh, seg, g};
          best_cost = cost;
        }
      }
    }
  }
  return best;
}

// templates/wgrad_halo.cuh: T's tile and S's halo staged once per k-step, two blocks per SM.
void AddHaloWeightGradient(const WeightGradient& wg, const HaloTile& h, const ChainInfo& info,
                           const std::string& gu, const PlanTarget& target, bool prec3,
                           Plan& plan) {
  const int64_t tiles = CeilDiv(wg.cols(), h.bn) * CeilDiv(wg.rows, h.bm);
  const int64_t max_splits = std::max<int64_t>(
      1, std::min<int64_t>({h.g.steps / 8, 1024, kMaxPartsBytes / (wg.rows * wg.cols() * 8)}));
  int64_t splits = FillingSplits(tiles, 2 * target.sm_count, max_splits);
  const int64_t chunk = CeilDiv(h.g.steps, splits);
  splits = CeilDiv(h.g.steps, chunk);
  plan.includes.push_back("wgrad_halo.cuh");
  plan.tunes.push_back(
      {"WgTune",
       {TuneInt("kBM", h.bm), TuneInt("kBN", h.bn), TuneInt("kRH", h.rh), TuneInt("kSeg", h.seg),
        TuneInt("kSplits", splits), TuneInt("kChunk", chunk), TuneInt("kPrec3", prec3 ? 1 : 0)}});
  const size_t wpart = plan.AddWorkspace("weight-gradient partials per reduction chunk (double)",
                                         static_cast<size_t>(splits * wg.rows * wg.cols() * 8));
  KernelLaunch w{
      "fj_wgrad_partial",
      "fj::wgrad_halo_kernel<Cfg, WgTune>",
      absl::StrCat("weight gradient: ", wg.rows, " x ", wg.cols(), " GEMM over ", wg.reduction,
                   " (n, point) pairs in ", splits, " chunks of ", chunk, " tiles of ", h.rh, " x ",
                   h.seg, " points, S staged once per tile (",
                   prec3 ? "tensor cores, 3xTF32" : "tensor cores, TF32", ", double partials)"),
      {static_cast<unsigned>(CeilDiv(wg.cols(), h.bn)),
       static_cast<unsigned>(CeilDiv(wg.rows, h.bm)), static_cast<unsigned>(splits)},
      {256, 1, 1}};
  w.shared_bytes = static_cast<unsigned>(h.g.smem);
  w.min_blocks_per_sm = 2;
  w.args = {KernelArg::Tensor("x", std::string(kInputName), kRead),
            KernelArg::Tensor("gu", gu, kRead),
            KernelArg::Workspace(ArgType::kDouble, "part", wpart, kWrite)};
  plan.kernels.push_back(w);
  AddWeightGradientReduce(wg.rows * wg.cols(), info, wpart, plan);
}

// templates/wgrad.cuh: on tensor cores (mma.sync) on sm_80 and later where T has 8 or more
// channels, in 16-, 32- or 64-row tiles; FFMA below 8 rows and before sm_80 (sm_75).
void AddMmaWeightGradient(const WeightGradient& wg, const ChainInfo& info, const std::string& gu,
                          const PlanTarget& target, Plan& plan) {
  const int64_t rows = wg.rows, cols = wg.cols(), reduction = wg.reduction;
  const bool mma = HasAmpereFeatures(target.arch) && rows >= 8;
  const bool prec3 = target.precision != Precision::kTf32;
  if (mma) {
    if (std::optional<HaloTile> h = ChooseHaloTile(wg, reduction / wg.t_points, prec3)) {
      AddHaloWeightGradient(wg, *h, info, gu, target, prec3, plan);
      return;
    }
  }
  const WgTile t = mma ? ChooseMmaWgTile(rows, cols) : ChooseWgTile(rows, cols);
  const int64_t threads = t.threads;
  const int64_t tiles = CeilDiv(cols, t.bn) * CeilDiv(rows, t.bm);
  const int64_t max_splits =
      std::max<int64_t>(1, std::min(reduction / (64 * t.bk), kMaxPartsBytes / (rows * cols * 8)));
  // mma: one 64-row block per SM (its registers), two of the smaller ones, in whole waves, up to
  // 1024 chunks. FFMA: about four blocks of 128 threads (two of 256) per SM in whole waves
  // (rounded down: a last, nearly empty wave costs a whole one); its loads' latency needs the
  // warps (W1's at two blocks: 8 warps per SM, issue slots 56% busy, Nsight Compute; at four
  // 1.176 ms against 1.459, [16,4,32,32,32] k3 s2 0.611 against 0.782, H100, 2026-11-27). Each
  // chunk at least 64 steps long.
  const int64_t slots = target.sm_count * (t.bm == 64 ? 1 : 2);
  const int64_t ffma_blocks = threads <= 128 ? 4 : 2;
  int64_t splits = mma ? FillingSplits(tiles, slots, std::min<int64_t>(1024, max_splits))
                       : std::clamp<int64_t>(ffma_blocks * target.sm_count / tiles, 1, max_splits);
  const int64_t chunk = CeilDiv(CeilDiv(reduction, splits), t.bk) * t.bk;
  splits = CeilDiv(reduction, chunk);
  plan.includes.push_back("wgrad.cuh");
  plan.tunes.push_back({"WgTune",
                        {TuneInt("kBM", t.bm), TuneInt("kBN", t.bn), TuneInt("kBK", t.bk),
                         TuneInt("kTM", t.tm), TuneInt("kTN", t.tn), TuneInt("kThreads", threads),
                         TuneInt("kSplits", splits), TuneInt("kChunk", chunk)}});
  if (mma) plan.tunes.back().fields.push_back(TuneInt("kPrec3", prec3 ? 1 : 0));
  const size_t wpart = plan.AddWorkspace("weight-gradient partials per reduction chunk (double)",
                                         static_cast<size_t>(splits * rows * cols * 8));
  KernelLaunch w{
      "fj_wgrad_partial",
      mma ? "fj::wgrad_mma_partial_kernel<Cfg, WgTune>" : "fj::wgrad_partial_kernel<Cfg, WgTune>",
      absl::StrCat("weight gradient: ", rows, " x ", cols, " GEMM over ", reduction,
                   " (n, point) pairs in ", splits, " chunks (",
                   mma ? (prec3 ? "tensor cores, 3xTF32" : "tensor cores, TF32") : "FFMA",
                   ", double partials)"),
      {static_cast<unsigned>(CeilDiv(cols, t.bn)), static_cast<unsigned>(CeilDiv(rows, t.bm)),
       static_cast<unsigned>(splits)},
      {static_cast<unsigned>(threads), 1, 1}};
  if (mma && t.bm < 64) w.min_blocks_per_sm = 2;  // the two blocks per SM `slots` counts on
  // FFMA at 128 threads: the four blocks `splits` counts on (registers capped at 128; W1's tile
  // needed 146 uncapped). 256-thread tiles (sm_75's larger ones) keep their registers.
  if (!mma && threads <= 128) w.min_blocks_per_sm = static_cast<unsigned>(ffma_blocks);
  w.args = {KernelArg::Tensor("x", std::string(kInputName), kRead),
            KernelArg::Tensor("gu", gu, kRead),
            KernelArg::Workspace(ArgType::kDouble, "part", wpart, kWrite)};
  plan.kernels.push_back(w);
  AddWeightGradientReduce(wg.rows * wg.cols(), info, wpart, plan);
}

// templates/wgrad_direct.cuh: a conv3d with at most 4 input channels and at most 32 output
// channels, a kernel 5 wide and stride 1 along w, on FFMA without im2col, where it measured
// faster than the tensor-core halo kernel (H100, 2026-11-27, bench/notes/
// wgrad_direct_ffma_v3_session13_2026-11-27.txt): [64,1,32^3] k=5 0.238 against 0.359 ms,
// [8,2,32^3] k=5 (24 channels) 0.123 against 0.139; not for narrower kernels: W2 (k=4) 3.02
// against 2.84, k=3 and k=4 with stride 2 0.037 against 0.025 and 0.212 against 0.161 (another
// k=3 with stride 2: 0.039 against 0.042). Kernels
// 6 and 7 wide are correct on it (GpuBackward.DirectWeightGradient) but were not timed: the halo
// kernel amortizes its staging over more taps there, so they keep it until measured.
struct DirectWgradTile {
  int64_t ct, rows, copies, planes, blocks, per_sm;
  fj::geom::WgradDirect g;
};
constexpr int64_t kDirectWgradMaxCin = 4;
constexpr int64_t kDirectWgradMaxRows = 32;
constexpr int64_t kDirectWgradKernelW = 5;  // the kernel width it was measured faster at

std::optional<DirectWgradTile> ChooseDirectWgrad(const WeightGradient& wg, int64_t n,
                                                 const PlanTarget& target) {
  const ConvAttrs& a = wg.conv;
  // cp.async: sm_80 and later.
  if (!HasAmpereFeatures(target.arch) || wg.rows > kDirectWgradMaxRows ||
      wg.s_channels > kDirectWgradMaxCin || a.kernel[2] != kDirectWgradKernelW ||
      a.stride[2] != 1) {
    return std::nullopt;
  }
  const int64_t kw = a.kernel[2], c = wg.rows;
  // Channels per thread: the most of 16, 8, 4 with at most 32 fp32 accumulators (and 32 doubles:
  // about 120 registers in all), not past c rounded up to 4.
  int64_t ct = 4;
  for (int64_t t : {16, 8}) {
    if (t * kw <= 32 && t <= CeilDiv(c, 4) * 4) {
      ct = t;
      break;
    }
  }
  const int64_t h = wg.t_grid[1], w = wg.t_grid[2];
  const int64_t rows = std::min<int64_t>(h, 8);
  const int64_t tasks = wg.s_channels * a.kernel[0] * a.kernel[1] * CeilDiv(c, ct);
  if (tasks > 512) return std::nullopt;
  // Copies of the tasks up to 256 threads (each takes every copies-th row of a stage).
  const int64_t copies = std::clamp<int64_t>(256 / tasks, 1, rows);
  const fj::geom::WgradDirect g =
      fj::geom::WgradDirectOf(wg.s_channels, c, w, a.kernel[0], a.kernel[1], kw, a.stride[1],
                              a.stride[2], a.dilation[1], a.dilation[2], ct, rows, copies);
  if (g.smem > 110 * 1024) return std::nullopt;  // two blocks per SM
  // Blocks per SM: registers (about 128 a thread) and shared memory.
  const int64_t per_sm = std::max<int64_t>(
      1, std::min<int64_t>(512 / g.threads, SharedOptInLimit(target.arch) / (g.smem + 1024)));
  // Planes per block: the busiest SM's fewest planes, with at most 8 waves of blocks (each
  // writes its partials: W2 would otherwise write 327 MB of them), at most 64 planes a block.
  const int64_t planes = n * wg.t_grid[0];
  const int64_t weights = wg.rows * wg.cols();
  const int64_t max_blocks =
      std::min(8 * per_sm * target.sm_count, std::max<int64_t>(1, kMaxPartsBytes / (weights * 8)));
  DirectWgradTile best{ct, rows, copies, 0, 0, per_sm, g};
  int64_t best_load = 0;
  for (int64_t pb = 1; pb <= 64; ++pb) {
    const int64_t blocks = CeilDiv(planes, pb);
    if (blocks > max_blocks && pb < 64) continue;
    // The busiest SM runs ceil(blocks / sms) blocks, per_sm at a time: its planes in sequence.
    const int64_t load = CeilDiv(CeilDiv(blocks, target.sm_count), per_sm) * pb;
    if (best.planes == 0 || load < best_load) {
      best.planes = pb;
      best.blocks = blocks;
      best_load = load;
    }
  }
  if (best.planes == 0) return std::nullopt;
  return best;
}

void AddDirectWeightGradient(const WeightGradient& wg, const DirectWgradTile& t,
                             const ChainInfo& info, const std::string& gu, Plan& plan) {
  plan.includes.push_back("wgrad_direct.cuh");
  plan.includes.push_back("wgrad_reduce.cuh");
  plan.tunes.push_back({"WgTune",
                        {TuneInt("kCT", t.ct), TuneInt("kRows", t.rows),
                         TuneInt("kCopies", t.copies), TuneInt("kPlanes", t.planes),
                         TuneInt("kThreads", t.g.threads), TuneInt("kSplits", t.blocks)}});
  const size_t wpart = plan.AddWorkspace("weight-gradient partials per block (double)",
                                         static_cast<size_t>(t.blocks * wg.rows * wg.cols() * 8));
  KernelLaunch w{
      "fj_wgrad_partial",
      "fj::wgrad_direct_kernel<Cfg, WgTune>",
      absl::StrCat("weight gradient on FFMA: a thread per (input channel, kd, kh, ", t.ct,
                   " output channels) x ", t.copies, " copies, every kw tap, ", t.planes,
                   " (n, d) planes per block in stages of ", t.rows,
                   " rows (grad_u channels-last and x's rows in shared memory), double partials"),
      {static_cast<unsigned>(t.blocks), 1, 1},
      {static_cast<unsigned>(t.g.threads), 1, 1}};
  w.shared_bytes = static_cast<unsigned>(t.g.smem);
  w.min_blocks_per_sm = static_cast<unsigned>(std::min<int64_t>(t.per_sm, 4));
  w.args = {KernelArg::Tensor("x", std::string(kInputName), kRead),
            KernelArg::Tensor("gu", gu, kRead),
            KernelArg::Workspace(ArgType::kDouble, "part", wpart, kWrite)};
  plan.kernels.push_back(w);
  AddWeightGradientReduce(wg.rows * wg.cols(), info, wpart, plan);
}

// wgmma (templates/wgrad_wgmma.cuh, wgrad_taps.cuh) on sm_90 where both channel counts fill half a
// 64-wide tile.
bool UseWgmmaWeightGradient(const WeightGradient& wg, const PlanTarget& target) {
  if (target.arch != "sm_90" && target.arch != "sm_90a") return false;
  return wg.rows >= 32 && wg.s_channels >= 32 && wg.reduction < (int64_t{1} << 31);
}

// Tap reuse (templates/wgrad_taps.cuh) for stride 1 and a kernel at least 2 wide: 2 or 3 kw taps
// per CTA, the fewest idle warpgroups (the most taps when tied); 1: the one-tap kernel.
int64_t WgradTapsPerCta(const WeightGradient& wg) {
  const ConvAttrs& c = wg.conv;
  if (c.stride != Dims3{1, 1, 1} || c.kernel[2] < 2) return 1;
  const int64_t kw = c.kernel[2];
  return CeilDiv(kw, 3) * 3 - kw <= CeilDiv(kw, 2) * 2 - kw ? 3 : 2;
}

// The wgmma weight gradient's launch shape, every size its kernels and the plan agree on: one tap
// per CTA (wgrad_wgmma.cuh), or `taps` kw taps per CTA on E's grid (wgrad_taps.cuh, geometry e).
struct WgmmaWgradShape {
  bool three = true;  // F16x3 (fp32-accurate), else one fp16 product (the TF32 class)
  int64_t bn = 0, taps = 1, stages = 0;
  int64_t smem = 0, t_bytes = 0, s_bytes = 0;  // the GEMM kernel's; the operand copies
  int64_t a_tiles = 0, b_tiles = 0;            // 64-channel tiles of T and S
  int64_t ctas_x = 0;                          // grid.x: tap groups x column tiles
  int64_t k_rows = 0, chunk = 0, splits = 0;   // K rows, per chunk (grid.z = splits)
  fj::geom::WgradTaps e{};
  std::string one_tap_why;  // taps == 1: why (explain shows it)
};

WgmmaWgradShape ChooseWgmmaWgradShape(const WeightGradient& wg, int64_t n,
                                      const PlanTarget& target) {
  WgmmaWgradShape sh;
  sh.three = target.precision != Precision::kTf32;
  sh.bn = wg.s_channels <= 64 ? 64 : 128;
  sh.taps = WgradTapsPerCta(wg);
  if (sh.taps == 1) {
    const ConvAttrs& c = wg.conv;
    sh.one_tap_why = c.stride != Dims3{1, 1, 1}
                         ? absl::StrCat("stride ", c.stride[0], "x", c.stride[1], "x", c.stride[2],
                                        ": tap reuse needs stride 1")
                         : "a kernel 1 wide: no kw taps to share";
  }
  const int64_t step = fj::geom::kWgradKStep, products = sh.three ? 3 : 1;
  const Dims3& k = wg.conv.kernel;
  const Dims3& dil = wg.conv.dilation;
  const auto taps_geom = [&](int64_t stages) {
    return fj::geom::WgradTapsOf(n, wg.rows, wg.s_channels, wg.t_grid[0], wg.t_grid[1],
                                 wg.t_grid[2], k[0], k[1], k[2], dil[0], dil[1], dil[2], sh.bn,
                                 stages, products, sh.taps);
  };
  // One tap per CTA: the widest tile the S channels fill; as many stages as let two CTAs share
  // an SM (measured on W3's weight gradient, H100: n = 128 with 2 stages 1.74 ms, 4 stages (one
  // CTA per SM) 2.23 ms; n = 64 with 3 stages 2.27 ms, 4 stages 3.21 ms). One product (TF32)
  // stages the highs alone: twice the stages in the same shared memory, for a k-step of a third
  // of the tensor-core work (W3's weight gradient, H100: 2 stages 1.29 ms).
  // Tap reuse: one CTA of 128 * taps threads per SM, as many stages as fit (3 to 6; fewer than 3
  // fit only for a very wide dilation, and E's rows must be int-indexable: one tap per CTA else).
  sh.stages = (sh.bn == 128 ? 2 : 3) * (sh.three ? 1 : 2);
  if (sh.taps > 1) {
    const fj::geom::WgradTaps one = taps_geom(1);
    const int64_t fit = (SharedOptInLimit(target.arch) - 1024) / one.stage_bytes;
    if (fit >= 3 && one.rows < (int64_t{1} << 31)) {
      sh.stages = std::min<int64_t>(fit, 6);
    } else {
      sh.taps = 1;
      sh.one_tap_why = fit < 3 ? "the S window of shared taps leaves room for fewer than 3 stages"
                               : "the extended grid's rows exceed int indexing";
    }
  }
  const fj::geom::WgradWgmma g = fj::geom::WgradWgmmaOf(n, wg.rows, wg.s_channels, wg.t_points,
                                                        wg.s_points, sh.bn, sh.stages, products);
  sh.a_tiles = g.a_tiles;
  sh.b_tiles = g.b_tiles;
  if (sh.taps > 1) {
    sh.e = taps_geom(sh.stages);
    sh.smem = sh.e.smem;
    sh.t_bytes = sh.e.t_bytes;
    sh.s_bytes = sh.e.s_bytes;
    sh.ctas_x = k[0] * k[1] * sh.e.groups * g.b_ctas;
    sh.k_rows = sh.e.steps * step;  // the k-steps of E's planes
  } else {
    sh.smem = g.smem;
    sh.t_bytes = g.t_bytes;
    sh.s_bytes = g.s_bytes;
    sh.ctas_x = wg.kv * g.b_ctas;
    sh.k_rows = wg.reduction;  // T's (n, point) pairs
  }
  // Chunks fill whole waves; tap reuse's are whole short runs (2 k-steps with three products, 4
  // with one: WgTapsShape::kFold).
  const int64_t per_sm = std::max<int64_t>(1, SharedOptInLimit(target.arch) / sh.smem);
  const int64_t chunk_step = sh.taps > 1 ? step * (sh.three ? 2 : 4) : step;
  const int64_t max_splits = std::max<int64_t>(
      1, std::min(sh.k_rows / (16 * step), kMaxPartsBytes / (wg.rows * wg.cols() * 8)));
  const int64_t splits = FillingSplits(sh.ctas_x * sh.a_tiles, per_sm * target.sm_count,
                                       std::min<int64_t>(64, max_splits));
  sh.chunk = CeilDiv(CeilDiv(sh.k_rows, splits), chunk_step) * chunk_step;
  sh.splits = CeilDiv(sh.k_rows, sh.chunk);
  return sh;
}

void AddWgmmaWeightGradient(const WeightGradient& wg, const Chain& chain, const ChainInfo& info,
                            const std::string& gu, const PlanTarget& target, Plan& plan,
                            std::optional<GradUMaxima> maxima) {
  const WgmmaWgradShape sh = ChooseWgmmaWgradShape(wg, chain.input[0], target);
  const bool three = sh.three;
  const int64_t taps = sh.taps, splits = sh.splits;
  const fj::geom::WgradTaps& e = sh.e;
  // fp32-accurate: three products of the fp16 splits; TF32: the highs' product alone (the same
  // rounding of each operand as TF32's, at the f16 rate).
  const char* const operands = three ? "fp16 highs and lows" : "fp16 highs";
  plan.includes.push_back(taps > 1 ? "wgrad_taps.cuh" : "wgrad_wgmma.cuh");
  plan.arch_override = "sm_90a";
  plan.tunes.push_back(
      {"WgTune",
       {TuneInt("kBN", sh.bn), TuneInt("kStages", sh.stages), TuneInt("kSplits", splits),
        TuneInt("kChunk", sh.chunk), TuneInt("kAbsmaxBlocks", fj::geom::kWgradAbsmaxBlocks),
        TuneInt("kProducts", three ? 3 : 1), TuneInt("kGuMaxima", maxima ? maxima->count : 0),
        TuneInt("kTaps", taps)}});
  const size_t absmax = plan.AddWorkspace("weight gradient: max|T|, max|S| per block",
                                          2 * fj::geom::kWgradAbsmaxBlocks * 4);
  const size_t tp = plan.AddWorkspace(absl::StrCat("weight gradient: T channels-last, ", operands),
                                      static_cast<size_t>(sh.t_bytes));
  const size_t sp = plan.AddWorkspace(absl::StrCat("weight gradient: S channels-last, ", operands),
                                      static_cast<size_t>(sh.s_bytes));
  const size_t wpart = plan.AddWorkspace("weight-gradient partials per reduction chunk (double)",
                                         static_cast<size_t>(splits * wg.rows * wg.cols() * 8));
  const auto ws = [](ArgType type, const char* name, size_t offset, KernelArg::Access access) {
    return KernelArg::Workspace(type, name, offset, access);
  };
  const KernelArg x = KernelArg::Tensor("x", std::string(kInputName), kRead);
  const KernelArg gu_arg = KernelArg::Tensor("gu", gu, kRead);
  const std::array<unsigned, 3> block256 = {256, 1, 1};
  KernelLaunch am{
      "fj_wgrad_absmax",
      "fj::wgrad_absmax_kernel<Cfg, WgTune>",
      absl::StrCat("weight gradient: max|T| and max|S| (the ", three ? "F16x3" : "fp16", " scales)",
                   maxima ? absl::StrCat("; max|grad_u| from the ", maxima->count,
                                         " per-block maxima of the kernel writing it")
                          : ""),
      {static_cast<unsigned>(fj::geom::kWgradAbsmaxBlocks), 1, 1},
      block256};
  am.args = {x, maxima ? KernelArg::Null(ArgType::kTensorDType, "gu", kRead) : gu_arg,
             maxima ? KernelArg::Tensor("gmax", maxima->tensor, kRead)
                    : KernelArg::Null(ArgType::kFloat, "gmax", kRead),
             ws(ArgType::kFloat, "absmax", absmax, kWrite)};
  plan.kernels.push_back(am);
  for (int which = 0; which < 2; ++which) {
    const int64_t points = which == 0 ? wg.t_points : wg.s_points;
    const unsigned tiles_of = static_cast<unsigned>(which == 0 ? sh.a_tiles : sh.b_tiles);
    KernelLaunch pr{
        which == 0 ? "fj_wgrad_prep_t" : "fj_wgrad_prep_s",
        absl::StrCat(taps > 1 ? "fj::wgrad_taps_prep_kernel" : "fj::wgrad_prep_kernel",
                     "<Cfg, WgTune, ", which, ">"),
        absl::StrCat("weight gradient: ", which == 0 ? "T" : "S", " channels-last as ", operands,
                     taps > 1 ? absl::StrCat(" on the ", e.ed, "x", e.eh, "x", e.ew,
                                             " grid, rows per tile contiguous")
                              : ""),
        taps > 1 ? std::array<unsigned, 3>{static_cast<unsigned>(CeilDiv(e.rows, 64)), tiles_of, 1}
                 : std::array<unsigned, 3>{static_cast<unsigned>(CeilDiv(points, 64)), tiles_of,
                                           static_cast<unsigned>(chain.input[0])},
        {static_cast<unsigned>(fj::geom::kWgradPrepThreads), 1, 1}};
    pr.args = {x, gu_arg, ws(ArgType::kFloat, "absmax", absmax, kRead),
               ws(ArgType::kBytes, "out", which == 0 ? tp : sp, kWrite)};
    plan.kernels.push_back(pr);
  }
  const std::string per_cta = taps > 1
                                  ? absl::StrCat(taps, " kw taps per CTA sharing the staged rows (",
                                                 e.ed, "x", e.eh, "x", e.ew, " grid), ")
                                  : absl::StrCat("one tap per CTA (", sh.one_tap_why, "), ");
  KernelLaunch w{
      taps > 1 ? "fj_wgrad_taps" : "fj_wgrad_wgmma",
      taps > 1 ? "fj::wgrad_taps_kernel<Cfg, WgTune>" : "fj::wgrad_wgmma_kernel<Cfg, WgTune>",
      absl::StrCat("weight gradient: ", wg.kv, " taps of a ", wg.rows, " x ", wg.s_channels,
                   " GEMM over ", sh.k_rows, " K rows in ", splits, " chunks (wgmma, ", per_cta,
                   three ? "F16x3" : "one fp16 product, TF32 class", ", double partials)"),
      {static_cast<unsigned>(sh.ctas_x), static_cast<unsigned>(sh.a_tiles),
       static_cast<unsigned>(splits)},
      {static_cast<unsigned>(128 * taps), 1, 1}};
  w.shared_bytes = static_cast<unsigned>(sh.smem);
  if (taps > 1) w.min_blocks_per_sm = 1;
  w.restrict_pointers = true;
  w.args = {ws(ArgType::kBytes, "tp", tp, kRead), ws(ArgType::kBytes, "sp", sp, kRead),
            ws(ArgType::kFloat, "absmax", absmax, kRead),
            ws(ArgType::kDouble, "part", wpart, kWrite)};
  plan.kernels.push_back(w);
  AddWeightGradientReduce(wg.rows * wg.cols(), info, wpart, plan);
}

}  // namespace

// 32 weights per block of 256 threads.
void AddWeightGradientReduce(int64_t weights, const ChainInfo& info, size_t wpart, Plan& plan) {
  KernelLaunch wr{"fj_wgrad_reduce",
                  "fj::wgrad_reduce_kernel<Cfg, WgTune>",
                  "weight gradient: sum the chunks in a fixed order",
                  {static_cast<unsigned>(CeilDiv(weights, 32)), 1, 1},
                  {256, 1, 1}};
  wr.args = {KernelArg::Workspace(ArgType::kDouble, "part", wpart, kRead),
             KernelArg::Tensor("grad_w", GradName(info.weight_param), kWrite)};
  plan.kernels.push_back(wr);
}

namespace {
// The engine AddWeightGradient runs for `wg`: the direct FFMA kernel where it has a tile, else
// wgmma where it applies, else the mma.sync / FFMA partial kernels (the header's list).
struct Engine {
  std::optional<DirectWgradTile> direct;
  bool wgmma = false;
};
Engine ChooseEngine(const WeightGradient& wg, const Chain& chain, const PlanTarget& target) {
  Engine e;
  if (AnalyzeChain(chain).producer->kind == OpKind::kConv3d) {
    e.direct = ChooseDirectWgrad(wg, chain.input[0], target);
  }
  e.wgmma = !e.direct && UseWgmmaWeightGradient(wg, target);
  return e;
}
}  // namespace

bool WeightGradientReadsGradUMaxima(const WeightGradient& wg, const Chain& chain,
                                    const PlanTarget& target) {
  return ChooseEngine(wg, chain, target).wgmma;
}

void AddWeightGradient(const WeightGradient& wg, const Chain& chain, const ChainInfo& info,
                       const std::string& gu, const PlanTarget& target, Plan& plan,
                       std::optional<GradUMaxima> maxima) {
  const Engine e = ChooseEngine(wg, chain, target);
  if (e.direct) {
    AddDirectWeightGradient(wg, *e.direct, info, gu, plan);
  } else if (e.wgmma) {
    AddWgmmaWeightGradient(wg, chain, info, gu, target, plan, maxima);
  } else {
    AddMmaWeightGradient(wg, info, gu, target, plan);
  }
}

}  // namespace fusejit::codegen
