#include "codegen/backward_plan.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/strategy_util.h"
#include "fmt/format.h"
#include "fusejit/signature.h"
#include "templates/geometry.cuh"

namespace fusejit::codegen {
namespace {

constexpr int kThreads = 256;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

TuneStruct::Field Int(const char* name, int64_t value) {
  return {"int", name, absl::StrCat(value)};
}

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

// The weight gradient's GEMM: rows x cols (cols = s_channels * kv) over `reduction` (n, point)
// pairs (templates/wgrad.cuh's T, S notation).
struct WeightGradient {
  int64_t rows;        // T's channels (conv3d: output channels; conv_transpose3d: input ones)
  int64_t s_channels;  // S's channels
  int64_t kv;          // kernel taps
  int64_t reduction;   // n * T's points
  int64_t t_points, s_points;  // per sample
  Dims3 t_grid;                // T's grid (d, h, w)
  ConvAttrs conv;              // the producer's kernel, stride, padding, dilation
  int64_t cols() const { return s_channels * kv; }
};

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

// wgrad_reduce_kernel: grad_w (`weights` values) = the partials summed in a fixed order; 32
// weights per block of 256 threads.
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
       {Int("kBM", h.bm), Int("kBN", h.bn), Int("kRH", h.rh), Int("kSeg", h.seg),
        Int("kSplits", splits), Int("kChunk", chunk), Int("kPrec3", prec3 ? 1 : 0)}});
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
  plan.tunes.push_back(
      {"WgTune",
       {Int("kBM", t.bm), Int("kBN", t.bn), Int("kBK", t.bk), Int("kTM", t.tm), Int("kTN", t.tn),
        Int("kThreads", threads), Int("kSplits", splits), Int("kChunk", chunk)}});
  if (mma) plan.tunes.back().fields.push_back(Int("kPrec3", prec3 ? 1 : 0));
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
// channels, a kernel 5 to 7 wide and stride 1 along w, on FFMA without im2col, where it measured
// faster than the tensor-core halo kernel (H100, 2026-11-27, bench/notes/
// wgrad_direct_ffma_v3_session13_2026-11-27.txt): [64,1,32^3] k=5 0.238 against 0.359 ms,
// [8,2,32^3] k=5 (24 channels) 0.123 against 0.139; not for narrower kernels: W2 (k=4) 3.02
// against 2.84, k=3 and k=4 with stride 2 0.037 against 0.025 and 0.212 against 0.161.
struct DirectWgradTile {
  int64_t ct, rows, copies, planes, blocks, per_sm;
  fj::geom::WgradDirect g;
};
constexpr int64_t kDirectWgradMaxCin = 4;
constexpr int64_t kDirectWgradMaxRows = 32;

std::optional<DirectWgradTile> ChooseDirectWgrad(const WeightGradient& wg, int64_t n,
                                                 const PlanTarget& target) {
  const ConvAttrs& a = wg.conv;
  // cp.async: sm_80 and later.
  if (!HasAmpereFeatures(target.arch) || wg.rows > kDirectWgradMaxRows ||
      wg.s_channels > kDirectWgradMaxCin || a.kernel[2] < 5 || a.kernel[2] > 7 ||
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
  plan.tunes.push_back(
      {"WgTune",
       {Int("kCT", t.ct), Int("kRows", t.rows), Int("kCopies", t.copies), Int("kPlanes", t.planes),
        Int("kThreads", t.g.threads), Int("kSplits", t.blocks)}});
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

// wgmma (templates/wgrad_wgmma.cuh) on sm_90 where both channel counts fill half a 64-wide tile.
bool UseWgmmaWeightGradient(const WeightGradient& wg, const PlanTarget& target) {
  if (target.arch != "sm_90" && target.arch != "sm_90a") return false;
  return wg.rows >= 32 && wg.s_channels >= 32 && wg.reduction < (int64_t{1} << 31);
}

void AddWgmmaWeightGradient(const WeightGradient& wg, const Chain& chain, const ChainInfo& info,
                            const std::string& gu, const PlanTarget& target, Plan& plan) {
  // The widest tile the S channels fill; as many stages as let two CTAs share an SM (measured
  // on W3's weight gradient, H100: n = 128 with 2 stages 1.74 ms, 4 stages (one CTA per
  // SM) 2.23 ms; n = 64 with 3 stages 2.27 ms, 4 stages 3.21 ms).
  const int64_t bn = wg.s_channels <= 64 ? 64 : 128;
  const int64_t stages = bn == 128 ? 2 : 3;
  const fj::geom::WgradWgmma g = fj::geom::WgradWgmmaOf(chain.input[0], wg.rows, wg.s_channels,
                                                        wg.t_points, wg.s_points, bn, stages);
  const int64_t per_sm = std::max<int64_t>(1, SharedOptInLimit(target.arch) / g.smem);
  const int64_t tiles = wg.kv * g.b_ctas * g.a_tiles;
  const int64_t step = fj::geom::kWgradKStep;
  const int64_t max_splits = std::max<int64_t>(
      1, std::min(wg.reduction / (16 * step), kMaxPartsBytes / (wg.rows * wg.cols() * 8)));
  int64_t splits =
      FillingSplits(tiles, per_sm * target.sm_count, std::min<int64_t>(64, max_splits));
  const int64_t chunk = CeilDiv(CeilDiv(wg.reduction, splits), step) * step;
  splits = CeilDiv(wg.reduction, chunk);
  plan.includes.push_back("wgrad_wgmma.cuh");
  plan.arch_override = "sm_90a";
  plan.tunes.push_back(
      {"WgTune",
       {Int("kBN", bn), Int("kStages", stages), Int("kSplits", splits), Int("kChunk", chunk),
        Int("kAbsmaxBlocks", fj::geom::kWgradAbsmaxBlocks)}});
  const size_t absmax = plan.AddWorkspace("weight gradient: max|T|, max|S| per block",
                                          2 * fj::geom::kWgradAbsmaxBlocks * 4);
  const size_t tp = plan.AddWorkspace("weight gradient: T channels-last, fp16 highs and lows",
                                      static_cast<size_t>(g.t_bytes));
  const size_t sp = plan.AddWorkspace("weight gradient: S channels-last, fp16 highs and lows",
                                      static_cast<size_t>(g.s_bytes));
  const size_t wpart = plan.AddWorkspace("weight-gradient partials per reduction chunk (double)",
                                         static_cast<size_t>(splits * wg.rows * wg.cols() * 8));
  const auto ws = [](ArgType type, const char* name, size_t offset, KernelArg::Access access) {
    return KernelArg::Workspace(type, name, offset, access);
  };
  const KernelArg x = KernelArg::Tensor("x", std::string(kInputName), kRead);
  const KernelArg gu_arg = KernelArg::Tensor("gu", gu, kRead);
  const std::array<unsigned, 3> block256 = {256, 1, 1};
  KernelLaunch am{"fj_wgrad_absmax",
                  "fj::wgrad_absmax_kernel<Cfg, WgTune>",
                  "weight gradient: max|T| and max|S| (the F16x3 scales)",
                  {static_cast<unsigned>(fj::geom::kWgradAbsmaxBlocks), 1, 1},
                  block256};
  am.args = {x, gu_arg, ws(ArgType::kFloat, "absmax", absmax, kWrite)};
  plan.kernels.push_back(am);
  for (int which = 0; which < 2; ++which) {
    const int64_t points = which == 0 ? wg.t_points : wg.s_points;
    KernelLaunch pr{which == 0 ? "fj_wgrad_prep_t" : "fj_wgrad_prep_s",
                    absl::StrCat("fj::wgrad_prep_kernel<Cfg, WgTune, ", which, ">"),
                    which == 0 ? "weight gradient: T channels-last as fp16 highs and lows"
                               : "weight gradient: S channels-last as fp16 highs and lows",
                    {static_cast<unsigned>(CeilDiv(points, 64)),
                     static_cast<unsigned>(which == 0 ? g.a_tiles : g.b_tiles),
                     static_cast<unsigned>(chain.input[0])},
                    block256};
    pr.args = {x, gu_arg, ws(ArgType::kFloat, "absmax", absmax, kRead),
               ws(ArgType::kBytes, "out", which == 0 ? tp : sp, kWrite)};
    plan.kernels.push_back(pr);
  }
  KernelLaunch w{"fj_wgrad_wgmma",
                 "fj::wgrad_wgmma_kernel<Cfg, WgTune>",
                 absl::StrCat("weight gradient: ", wg.kv, " taps of a ", wg.rows, " x ",
                              wg.s_channels, " GEMM over ", wg.reduction, " (n, point) pairs in ",
                              splits, " chunks (wgmma, F16x3, double partials)"),
                 {static_cast<unsigned>(wg.kv * g.b_ctas), static_cast<unsigned>(g.a_tiles),
                  static_cast<unsigned>(splits)},
                 {128, 1, 1}};
  w.shared_bytes = static_cast<unsigned>(g.smem);
  w.restrict_pointers = true;
  w.args = {ws(ArgType::kBytes, "tp", tp, kRead), ws(ArgType::kBytes, "sp", sp, kRead),
            ws(ArgType::kFloat, "absmax", absmax, kRead),
            ws(ArgType::kDouble, "part", wpart, kWrite)};
  plan.kernels.push_back(w);
  AddWeightGradientReduce(wg.rows * wg.cols(), info, wpart, plan);
}

// ---- few input channels: templates/few_in_backward.cuh ------------------------------------
// One kernel computes grad_u on the fly, grad_x, the weight partials and the bias partials (no
// grad_u tensor, no data-gradient step). Taken for conv_transpose3d, and conv3d with stride 1
// and padding <= (kernel-1)*dilation, with at most 4 input channels (the weight-gradient GEMM has
// fewer than 8 rows there, FFMA; the data gradient is a few-out convolution: three passes over
// grad_u, against two over u and grad_y here), at most kFewInMaxTaps taps and
// kFewInMaxTapsPerOutput taps per output point (below), whose tile fits.
constexpr int kFewInThreads = 256;
constexpr int64_t kFewInMaxCin = 4;
constexpr int64_t kFewInMaxTaps = 64;
constexpr int64_t kFewInMaxTapsPerOutput = 48;
constexpr int64_t kFewInSharedLimit = 110 * 1024;  // two blocks per SM at least

struct FewInTile {
  int64_t xd = 0, xh = 0, xw = 0;
  fj::geom::FewInBwd g{};
};

// Why the producer is not one the kernel takes (above), channels and taps aside; empty if it is.
std::string FewInProducerRefusal(const ChainInfo& info) {
  if (info.producer->kind == OpKind::kConvTranspose3d) return "";
  const ConvAttrs& a = info.producer->conv;
  for (int d = 0; d < 3; ++d) {
    if (a.stride[d] != 1) return "conv3d with a stride other than 1";
    if (a.padding[d] > (a.kernel[d] - 1) * a.dilation[d]) {
      return "conv3d padding beyond the kernel's reach";
    }
  }
  return "";
}

fj::geom::FewInBwd FewInGeomOf(const Chain& chain, const ChainInfo& info, int64_t xd, int64_t xh,
                               int64_t xw) {
  const ConvAttrs& a = info.producer->conv;
  const Shape& x = chain.input;
  return fj::geom::FewInBwdOf(
      info.producer->kind == OpKind::kConvTranspose3d, x[1], info.producer_shape[1], x[2], x[3],
      x[4], a.kernel[0], a.kernel[1], a.kernel[2], a.stride[0], a.stride[1], a.stride[2],
      a.padding[0], a.padding[1], a.padding[2], a.dilation[0], a.dilation[1], a.dilation[2],
      a.output_padding[0], a.output_padding[1], a.output_padding[2],
      info.group_norm ? info.group_norm->groups : 0, xd, xh, xw, kFewInThreads);
}

// Blocks per SM the fused kernel is compiled for: three where a thread has at most 4 x points
// (its registers fit 85) and three blocks' shared memory fits, else two.
int64_t FewInBlocksPerSm(const fj::geom::FewInBwd& g) {
  return g.points_per_thread <= 4 && 3 * (g.smem + 1024) <= 227 * 1024 ? 3 : 2;
}

// Estimated instructions of one block for one channel (W1, H100, 2026-11-27: the kernel is bound
// by issuing instructions; staging a region point costs about 50 along whole-warp row segments
// and 60 for the rows' remaining columns, and short rows waste part of their DRAM sectors; a tap
// of an x point 1 + 2 * cin; a weight-partial reduce-scatter about 130).
double FewInBlockCost(const fj::geom::FewInBwd& g, int64_t cin, int64_t kv, int64_t threads) {
  const int64_t rows = g.ld * g.lh, whole = g.lw / 32, rem = g.lw % 32;
  // Rows read from DRAM in 32-byte sectors: about one partial sector more per row.
  const double staging = (static_cast<double>(rows * whole * 32) * 50 +
                          static_cast<double>(CeilDiv(rows * rem, threads) * threads) * 60) *
                         static_cast<double>(g.lw + 8) / static_cast<double>(g.lw);
  const double taps =
      static_cast<double>(g.points_per_thread * threads * kv) * static_cast<double>(1 + 2 * cin);
  return staging + taps + static_cast<double>(g.chunks * threads) * 130;
}

// Tile sides tried along an x axis of `extent` points: powers of two below twice the extent, and
// the extent split evenly into 1 to 4 parts (a 24-point axis gets 24, 12, 8 and 6: a 32-point tile
// would leave a quarter of its threads without a point), at most 64.
std::vector<int64_t> FewInTileSides(int64_t extent) {
  std::vector<int64_t> v;
  for (int64_t t = 1; t < 2 * extent && t <= 64; t *= 2) v.push_back(t);
  for (int64_t parts = 1; parts <= 4; ++parts) {
    const int64_t t = CeilDiv(extent, parts);
    if (t <= 64 && std::find(v.begin(), v.end(), t) == v.end()) v.push_back(t);
  }
  return v;
}

// The estimated time of `blocks` blocks of equal cost (1 each) at most per_sm on each of `sms`
// SMs: the busiest SM's ceil(blocks / sms) blocks, run per_sm at a time (the last batch with
// fewer), a batch of k blocks taking k / Efficiency(k). The kernel is bound by issuing
// instructions; three blocks of 8 warps keep the SM busy, two reach 1/1.2 of that (W1: the best
// 8-point tile 1.34 ms against the best 4-point one's 1.23), one about half (a block alone runs
// 1.5 times faster than beside two others). H100, 2026-11-27: W1's 2048 blocks (3 per SM) against
// 1024 of twice the points (2 per SM): 17 against 18.6 units, measured 1.23 against 1.34 ms; grids
// of 1.01 to 1.29 waves ran 10-43% slower than the unfused path until the tail was counted.
double FewInTime(int64_t blocks, int64_t per_sm, int64_t sms) {
  const auto efficiency = [](int64_t k) { return k >= 3 ? 1.0 : k == 2 ? 1.0 / 1.2 : 0.5; };
  const int64_t busiest = CeilDiv(blocks, sms);
  const int64_t batches = busiest / per_sm, last = busiest % per_sm;
  return static_cast<double>(batches * per_sm) / efficiency(per_sm) +
         (last > 0 ? static_cast<double>(last) / efficiency(last) : 0.0);
}

// The x tile of least estimated time (FewInTime of its grid times FewInBlockCost): up to 8 points
// per thread, shared memory for two blocks per SM. nullopt outside the domain above.
std::optional<FewInTile> ChooseFewInTile(const Chain& chain, const ChainInfo& info,
                                         const PlanTarget& target, std::string* why) {
  if (std::string r = FewInProducerRefusal(info); !r.empty()) {
    *why = r;
    return std::nullopt;
  }
  const Shape& x = chain.input;
  const int64_t kv =
      info.producer->conv.kernel[0] * info.producer->conv.kernel[1] * info.producer->conv.kernel[2];
  if (x[1] > kFewInMaxCin) {
    *why = absl::StrCat(x[1], " input channels (at most ", kFewInMaxCin, ")");
    return std::nullopt;
  }
  if (kv > kFewInMaxTaps) {
    *why = absl::StrCat(kv, " kernel taps (at most ", kFewInMaxTaps, ")");
    return std::nullopt;
  }
  // Its FFMA taps per output point (x points x taps / output points) at most 48: backward W1
  // (3.6 taps a point) 3.57 -> 1.97 ms and W4 (33.5) 1.65 -> 1.42 ms, but W2 (96) 6.34 -> 9.58 ms
  // (its weight gradient runs on tensor cores otherwise; H100, 2026-11-27).
  const Shape& u = info.producer_shape;
  if (x[2] * x[3] * x[4] * kv > kFewInMaxTapsPerOutput * u[2] * u[3] * u[4]) {
    *why = fmt::format(
        "{:.1f} taps per output point (at most {})",
        static_cast<double>(x[2] * x[3] * x[4] * kv) / static_cast<double>(u[2] * u[3] * u[4]),
        kFewInMaxTapsPerOutput);
    return std::nullopt;
  }
  std::optional<FewInTile> best;
  double best_cost = 0;
  for (int64_t xw : FewInTileSides(x[4])) {
    for (int64_t xh : FewInTileSides(x[3])) {
      for (int64_t xd : FewInTileSides(x[2])) {
        const int64_t points = xd * xh * xw;
        if (points > 8 * kFewInThreads) continue;
        const fj::geom::FewInBwd g = FewInGeomOf(chain, info, xd, xh, xw);
        if (g.smem > std::min(kFewInSharedLimit, SharedOptInLimit(target.arch)) || g.chunks > 16) {
          continue;
        }
        const double cost = FewInTime(x[0] * g.tiles, FewInBlocksPerSm(g), target.sm_count) *
                            FewInBlockCost(g, x[1], kv, kFewInThreads);
        if (!best || cost < best_cost) {
          best = FewInTile{xd, xh, xw, g};
          best_cost = cost;
        }
      }
    }
  }
  if (!best) *why = "no x tile's shared memory fits";
  return best;
}

// The fused kernel, the weight-gradient reduction; bpart (the conv bias) per (n, c, tile).
void AddFewInBackward(const Chain& chain, const ChainInfo& info, const FewInTile& t,
                      const std::string& u, KernelArg zpart_in, KernelArg stats_in,
                      std::optional<size_t> gpart, std::optional<size_t> bpart, Plan& plan) {
  const int64_t blocks = chain.input[0] * t.g.tiles;
  const int64_t kv =
      info.producer->conv.kernel[0] * info.producer->conv.kernel[1] * info.producer->conv.kernel[2];
  const int64_t weights = chain.input[1] * info.producer_shape[1] * kv;
  const bool norm = info.group_norm != nullptr;
  plan.includes.push_back("few_in_backward.cuh");
  plan.includes.push_back("wgrad_reduce.cuh");
  const int64_t unroll = 8, minb = FewInBlocksPerSm(t.g);
  // kUnroll: region points a thread loads before using them (8: 1.23 ms on W1, 4: 1.34).
  plan.tunes.push_back({"FewInTune",
                        {Int("kXD", t.xd), Int("kXH", t.xh), Int("kXW", t.xw),
                         Int("kThreads", kFewInThreads), Int("kUnroll", unroll)}});
  plan.tunes.push_back({"WgTune", {Int("kSplits", blocks)}});
  const size_t wpart = plan.AddWorkspace("weight-gradient partials per block (double)",
                                         static_cast<size_t>(blocks * weights * 8));
  KernelLaunch k{
      "fj_bwd_few_in",
      "fj::bwd_few_in_kernel<Cfg, BwdTune, FewInTune>",
      absl::StrCat("grad_u on the fly (never stored) -> grad_x, the weight partials and the bias "
                   "partials, per x tile of ",
                   t.xd, " x ", t.xh, " x ", t.xw, " points (", t.g.region,
                   "-point output region per channel in shared memory, FFMA)"),
      {static_cast<unsigned>(blocks), 1, 1},
      {kFewInThreads, 1, 1}};
  k.shared_bytes = static_cast<unsigned>(t.g.smem);
  k.min_blocks_per_sm = static_cast<unsigned>(minb);
  const auto ws = [](ArgType type, const char* name, size_t offset, KernelArg::Access access) {
    return KernelArg::Workspace(type, name, offset, access);
  };
  k.args = {KernelArg::Tensor("x", std::string(kInputName), kRead),
            KernelArg::Tensor("u", u, kRead),
            KernelArg::Tensor("gy", std::string(kGradOutputName), kRead),
            KernelArg::Tensor("w", info.weight_param, kRead),
            norm ? KernelArg::Tensor("gamma", info.gamma_param, kRead)
                 : KernelArg::Null(ArgType::kTensorDType, "gamma", kRead),
            norm ? KernelArg::Tensor("beta", info.beta_param, kRead)
                 : KernelArg::Null(ArgType::kTensorDType, "beta", kRead),
            std::move(zpart_in),
            std::move(stats_in),
            gpart ? ws(ArgType::kDouble2, "gpart", *gpart, kRead)
                  : KernelArg::Null(ArgType::kDouble2, "gpart", kRead),
            KernelArg::Tensor("gx", std::string(kGradInputName), kWrite),
            ws(ArgType::kDouble, "part", wpart, kWrite),
            bpart ? ws(ArgType::kDouble, "bpart", *bpart, kWrite)
                  : KernelArg::Null(ArgType::kDouble, "bpart", kWrite)};
  plan.kernels.push_back(k);
  AddWeightGradientReduce(weights, info, wpart, plan);
}

}  // namespace

Chain ProducerChain(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  Chain c;
  c.input = chain.input;
  c.dtype = chain.dtype;
  c.ops.assign(chain.ops.begin(), chain.ops.begin() + info.producer_index + 1);
  return c;
}

TensorSpec SavedProducerOutputSpec(const Chain& chain) {
  return {std::string(kProducerOutputName), TensorRole::kSaved, DType::kF32,
          AnalyzeChain(chain).producer_shape, 16};
}

TensorSpec SavedStatsSpec(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  return {std::string(kSavedStatsName),
          TensorRole::kSaved,
          DType::kF32,
          {chain.input[0], info.group_norm->groups, 2},
          16};
}

namespace {
// An argument where a kernel can store the saved tensor `name` (u or stats), left null.
bool IsOpenSaveSlot(const KernelArg& a, std::string_view name) {
  return a.name == name && a.kind == KernelArg::Kind::kParam && a.param.empty() &&
         a.type == ArgType::kFloat && a.access == KernelArg::Access::kWrite;
}
bool HasOpenSaveSlot(const Plan& plan, std::string_view name) {
  for (const KernelLaunch& k : plan.kernels) {
    for (const KernelArg& a : k.args) {
      if (IsOpenSaveSlot(a, name)) return true;
    }
  }
  return false;
}
}  // namespace

bool BackwardPlanWritesGradX(const Chain& chain, const Plan& plan) {
  if (AnalyzeChain(chain).producer == nullptr) return false;
  for (const TensorSpec& t : plan.signature) {
    if (t.name == kGradInputName) return true;
  }
  return false;
}

bool CanSaveProducerOutput(const Plan& plan) { return HasOpenSaveSlot(plan, kProducerOutputName); }
bool CanSaveStats(const Plan& plan) { return HasOpenSaveSlot(plan, kSavedStatsName); }

absl::Status SaveProducerOutput(const Chain& chain, Plan* plan) {
  if (!CanSaveProducerOutput(*plan) || !plan->signature.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", plan->strategy, " plan cannot also write u, the convolution's output"));
  }
  const bool stats = CanSaveStats(*plan);
  for (KernelLaunch& k : plan->kernels) {
    for (KernelArg& a : k.args) {
      for (std::string_view name : {kProducerOutputName, kSavedStatsName}) {
        if (IsOpenSaveSlot(a, name)) a.param = std::string(name);
      }
    }
  }
  // x, the parameters, y, u, stats, the workspace (the composite training forward's without
  // stats).
  plan->signature = ForwardSignature(chain, plan->workspace_bytes);
  auto at = plan->signature.end();
  if (!plan->signature.empty() && plan->signature.back().name == kWorkspaceName) --at;
  at = plan->signature.insert(at, SavedProducerOutputSpec(chain)) + 1;
  if (stats) plan->signature.insert(at, SavedStatsSpec(chain));
  const size_t bytes = SavedProducerOutputSpec(chain).bytes();
  absl::StrAppend(&plan->description, "; also writes u, the convolution's output (", bytes,
                  " bytes)", stats ? ", and the group statistics" : "", ", for the backward");
  return absl::OkStatus();
}

absl::StatusOr<Chain> DataGradientChain(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  const ConvAttrs& a = info.producer->conv;
  Chain c;
  c.input = info.producer_shape;
  c.dtype = chain.dtype;
  Op op;
  op.conv = a;
  op.conv.bias = false;
  op.conv.out_channels = chain.input[1];
  op.conv.output_padding = {0, 0, 0};
  if (info.producer->kind == OpKind::kConv3d) {
    // x's size D = (Do-1)*s - 2p + dil*(k-1) + r + 1 with r = (D + 2p - dil*(k-1) - 1) mod s.
    op.kind = OpKind::kConvTranspose3d;
    for (int d = 0; d < 3; ++d) {
      op.conv.output_padding[d] =
          (chain.input[2 + d] + 2 * a.padding[d] - a.dilation[d] * (a.kernel[d] - 1) - 1) %
          a.stride[d];
    }
  } else {
    // Its output has x's size Di + floor(output_padding / s) along each dimension: larger where
    // output_padding >= stride (dilation allows it), whose trailing points are not x's.
    op.kind = OpKind::kConv3d;
  }
  c.ops.push_back(op);
  // The shape rules above guarantee this; checked anyway.
  const Shape out = OutputShape(c);
  bool fits = out.size() == 5 && out[0] == chain.input[0] && out[1] == chain.input[1];
  for (int d = 2; fits && d < 5; ++d) {
    const bool larger_ok = info.producer->kind == OpKind::kConvTranspose3d &&
                           a.output_padding[d - 2] >= a.stride[d - 2];
    fits = out[d] == chain.input[d] || (larger_ok && out[d] > chain.input[d]);
  }
  if (!fits) {
    return absl::InternalError(absl::StrCat("data gradient chain ", FormatChain(c), " gives ",
                                            FormatShape(out), ", not x's ",
                                            FormatShape(chain.input)));
  }
  return c;
}

absl::StatusOr<Plan> PlanBackward(const Chain& chain, const PlanTarget& target, bool saved_stats) {
  if (chain.dtype != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat("no backward plan for dtype ",
                                                 DTypeName(chain.dtype), ": only f32 has one"));
  }
  const ChainInfo info = AnalyzeChain(chain);
  const bool producer = info.producer != nullptr;
  const bool norm = info.group_norm != nullptr;
  const bool bias = producer && info.producer->conv.bias;
  if (saved_stats && !norm) {
    return absl::InvalidArgumentError(absl::StrCat("PlanBackward: saved group statistics for ",
                                                   FormatChain(chain),
                                                   ", which has no group_norm"));
  }
  const Shape& p = info.producer_shape;
  const int64_t slices = p[0] * p[1];
  const int64_t spatial = p[2] * p[3] * p[4];
  const std::string u = std::string(producer ? kProducerOutputName : kInputName);
  // Few input channels: one kernel from grad_y's sums to grad_x (few_in_backward.cuh).
  std::string few_in_refusal;
  const std::optional<FewInTile> fused =
      producer ? ChooseFewInTile(chain, info, target, &few_in_refusal) : std::nullopt;
  const std::string gu = std::string(producer && !fused ? kProducerGradName : kGradInputName);

  Plan plan;
  plan.strategy = "backward";
  plan.derivatives = true;
  plan.description =
      "grad_y back through mean, the elementwise ops and group_norm to the producer's output "
      "(group statistics recomputed in double, or read from the training forward's), then the "
      "parameter gradients as fixed-order sums";
  plan.includes = {"backward.cuh"};
  if (producer && !fused) {
    absl::StrAppend(&plan.description, "; no fused few-input-channel kernel (",
                    few_in_refusal.empty() ? "no tile fits" : few_in_refusal, ")");
  }
  if (fused) {
    absl::StrAppend(&plan.description,
                    "; the convolution's data and weight gradients in the same kernel as grad_u, "
                    "which is never stored (few input channels)");
  }

  // The signature of this step.
  std::vector<TensorSpec>& sig = plan.signature;
  sig.push_back({std::string(kInputName), TensorRole::kInput, chain.dtype, chain.input, 16});
  if (producer) sig.push_back({u, TensorRole::kSaved, chain.dtype, p, 16});
  if (saved_stats) sig.push_back(SavedStatsSpec(chain));
  sig.push_back({std::string(kGradOutputName), TensorRole::kGradOutput, chain.dtype,
                 OutputShape(chain), 16});
  for (const ParamSpec& ps : ChainParams(chain)) {
    if (ps.op_index == static_cast<size_t>(info.group_norm_index) ||
        (fused && ps.name == info.weight_param)) {
      sig.push_back({ps.name, TensorRole::kParam, chain.dtype, ps.shape, 16});
    }
  }
  sig.push_back({gu, TensorRole::kGradInput, chain.dtype, fused ? chain.input : p, 16});
  for (const ParamSpec& ps : ChainParams(chain)) {
    sig.push_back({GradName(ps.name), TensorRole::kGradParam, chain.dtype, ps.shape, 16});
  }

  // Elementwise / group_norm part.
  const int64_t split =
      std::clamp<int64_t>(CeilDiv(4 * target.sm_count, slices), 1, std::max<int64_t>(1, spatial / 2048));
  // The bias partials' chunks per (n, c): the fused kernel's x tiles, or grad_u's chunks.
  const int64_t bias_split = fused ? fused->g.tiles : split;
  plan.tunes.push_back(
      {"BwdTune",
       {Int("kSplit", split), Int("kBiasSplit", bias_split), Int("kThreads", kThreads)}});
  const int64_t parts = slices * split;
  // The group statistics: recomputed (zpart) unless saved.
  const bool recompute_stats = norm && !saved_stats;
  const size_t zpart =
      recompute_stats ? plan.AddWorkspace("(sum z, sum z^2) per (n, c, chunk)", parts * 16) : 0;
  const size_t gpart =
      norm ? plan.AddWorkspace("(sum g_h, sum g_h*zhat) per (n, c, chunk)", parts * 16) : 0;
  const size_t bpart =
      bias ? plan.AddWorkspace("sum grad_u per (n, c, chunk)", slices * bias_split * 8) : 0;
  const auto ws = [](ArgType type, const char* name, size_t offset, KernelArg::Access access) {
    return KernelArg::Workspace(type, name, offset, access);
  };
  // Tensors of the signature (u and grad_u are the composite's f32 tensors).
  const auto in = [](const char* name, std::string tensor) {
    return KernelArg::Tensor(name, std::move(tensor), kRead);
  };
  const auto out = [](const char* name, std::string tensor) {
    return KernelArg::Tensor(name, std::move(tensor), kWrite);
  };
  const auto null = [](ArgType type, const char* name, KernelArg::Access access) {
    return KernelArg::Null(type, name, access);
  };
  const std::array<unsigned, 3> grid = {static_cast<unsigned>(parts), 1, 1};
  const std::array<unsigned, 3> block = {kThreads, 1, 1};
  // zpart, or null with saved statistics; the saved statistics, or null.
  const auto zpart_in = [&] {
    return recompute_stats ? ws(ArgType::kDouble2, "zpart", zpart, kRead)
                           : null(ArgType::kDouble2, "zpart", kRead);
  };
  const auto stats_in = [&] {
    return saved_stats ? KernelArg::Tensor("stats", std::string(kSavedStatsName), kRead)
                       : null(ArgType::kFloat, "stats", kRead);
  };
  if (recompute_stats && info.post_ops.empty()) {
    // g_h = grad_y: the sums need no statistics, so one pass reads u and grad_y once for both.
    KernelLaunch m{"fj_bwd_moments_sums", "fj::bwd_moments_sums_kernel<Cfg, BwdTune>",
                   "z = pre(u), g_h = grad_y (no op after group_norm): sums of z, z^2, g_h and "
                   "g_h*z per (n, c, chunk) in one pass",
                   grid, block};
    m.args = {in("u", u), in("gy", std::string(kGradOutputName)),
              ws(ArgType::kDouble2, "zpart", zpart, kWrite),
              ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    plan.kernels.push_back(m);
    KernelLaunch f{"fj_bwd_sums_fix",
                   "fj::bwd_sums_fix_kernel<Cfg, BwdTune>",
                   "per (n, g): sum g_h*z -> sum g_h*zhat with the group statistics",
                   {static_cast<unsigned>(p[0] * info.group_norm->groups), 1, 1},
                   block};
    f.args = {ws(ArgType::kDouble2, "zpart", zpart, kRead),
              ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    plan.kernels.push_back(f);
  } else if (norm) {
    if (recompute_stats) {
      KernelLaunch m{"fj_bwd_moments", "fj::bwd_moments_kernel<Cfg, BwdTune>",
                     "z = pre(u): sums of z and z^2 per (n, c, chunk), for the group statistics",
                     grid, block};
      m.args = {in("u", u), ws(ArgType::kDouble2, "zpart", zpart, kWrite)};
      plan.kernels.push_back(m);
    }
    KernelLaunch s{"fj_bwd_sums", "fj::bwd_sums_kernel<Cfg, BwdTune>",
                   "g_h = grad_y * post'(h): sums of g_h and g_h*zhat per (n, c, chunk)", grid, block};
    s.args = {in("u", u),
              in("gy", std::string(kGradOutputName)),
              in("gamma", info.gamma_param),
              in("beta", info.beta_param),
              zpart_in(),
              stats_in(),
              ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    plan.kernels.push_back(s);
  }
  if (fused) {
    AddFewInBackward(chain, info, *fused, u, zpart_in(), stats_in(),
                     norm ? std::optional<size_t>(gpart) : std::nullopt,
                     bias ? std::optional<size_t>(bpart) : std::nullopt, plan);
  }
  KernelLaunch g{"fj_bwd_grad_u", "fj::bwd_grad_u_kernel<Cfg, BwdTune>",
                 norm ? "grad_u = group_norm's backward of g_h, times pre'(u); conv-bias sums"
                      : "grad_u = grad_y times the ops' derivatives; conv-bias sums",
                 grid, block};
  g.args = {
      in("u", u),
      in("gy", std::string(kGradOutputName)),
      norm ? in("gamma", info.gamma_param) : null(ArgType::kTensorDType, "gamma", kRead),
      norm ? in("beta", info.beta_param) : null(ArgType::kTensorDType, "beta", kRead),
      zpart_in(),
      stats_in(),
      norm ? ws(ArgType::kDouble2, "gpart", gpart, kRead) : null(ArgType::kDouble2, "gpart", kRead),
      out("gu", gu),
      bias ? ws(ArgType::kDouble, "bpart", bpart, kWrite)
           : null(ArgType::kDouble, "bpart", kWrite)};
  if (!fused) plan.kernels.push_back(g);
  if (norm || bias) {
    KernelLaunch r{"fj_bwd_param_grads", "fj::bwd_param_grads_kernel<Cfg, BwdTune>",
                   "grad of group_norm weight, bias and conv bias: per channel, fixed-order sums",
                   {static_cast<unsigned>(p[1]), 1, 1}, block};
    r.args = {norm ? ws(ArgType::kDouble2, "gpart", gpart, kRead) : null(ArgType::kDouble2, "gpart", kRead),
              bias ? ws(ArgType::kDouble, "bpart", bpart, kRead) : null(ArgType::kDouble, "bpart", kRead),
              norm ? out("grad_gamma", GradName(info.gamma_param))
                   : null(ArgType::kTensorDType, "grad_gamma", kWrite),
              norm ? out("grad_beta", GradName(info.beta_param))
                   : null(ArgType::kTensorDType, "grad_beta", kWrite),
              bias ? out("grad_bias", GradName(info.bias_param))
                   : null(ArgType::kTensorDType, "grad_bias", kWrite)};
    plan.kernels.push_back(r);
  }

  // Weight gradient (the fused kernel's own).
  if (producer && !fused) {
    const bool conv = info.producer->kind == OpKind::kConv3d;
    const ConvAttrs& a = info.producer->conv;
    const int64_t rows = conv ? p[1] : chain.input[1];
    const int64_t kv = a.kernel[0] * a.kernel[1] * a.kernel[2];
    const int64_t reduction =
        chain.input[0] * (conv ? spatial : chain.input[2] * chain.input[3] * chain.input[4]);
    const int64_t s_channels = conv ? chain.input[1] : p[1];
    const int64_t t_points = conv ? spatial : chain.input[2] * chain.input[3] * chain.input[4];
    const int64_t s_points = conv ? chain.input[2] * chain.input[3] * chain.input[4] : spatial;
    const Dims3 t_grid =
        conv ? Dims3{p[2], p[3], p[4]} : Dims3{chain.input[2], chain.input[3], chain.input[4]};
    WeightGradient wg{rows, s_channels, kv, reduction, t_points, s_points, t_grid, a};
    const std::optional<DirectWgradTile> direct =
        conv ? ChooseDirectWgrad(wg, chain.input[0], target) : std::nullopt;
    if (direct) {
      AddDirectWeightGradient(wg, *direct, info, gu, plan);
    } else if (UseWgmmaWeightGradient(wg, target)) {
      AddWgmmaWeightGradient(wg, chain, info, gu, target, plan);
    } else {
      AddMmaWeightGradient(wg, info, gu, target, plan);
    }
  }
  if (plan.workspace_bytes > 0) {
    sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                   {static_cast<int64_t>(plan.workspace_bytes)}, 256});
  }
  return plan;
}

}  // namespace fusejit::codegen
