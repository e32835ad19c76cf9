// The tensor-core strategies for chains whose producer is expensive (many input channels, seed W3):
//   igemm-store-normalize  conv3d | conv_transpose3d (stride 1) | ew* | group_norm | ew*
//       templates/igemm_mma.cuh + igemm_wgmma.cuh + gn_apply.cuh: x is copied channels-last in the
//       operand encoding (prep), an implicit GEMM on Hopper's wgmma (sm_90a) computes the
//       convolution with the pre-norm ops and stores the pre-norm values into y with per-tile
//       group moments; the moments are merged in a fixed order and y is normalized in place.
//   igemm-moments-mean     conv3d | conv_transpose3d (stride 1) | ew* | group_norm | mean
//       the same prep and GEMM, whose epilogue writes only per-tile per-channel moments of the
//       pre-norm values (nothing full-size); templates/igemm_mean.cuh merges them in a fixed order
//       (double) into the mean of the group_norm output, gamma_c (m_c - mu_g) rstd_g + beta_c.
// Precision: kFp32 runs "F16x3" (x and w split into fp16 high/low pairs, three products, a
// short-run accumulator flushed every 2 k-steps; ~2.5e-7 relative on W3); kTf32, asked for by
// name, runs one TF32 product (~4e-4 relative).
// Tuning (both): wg (warpgroups per CTA: 64*wg-row tiles), stages (weight pipeline depth), async
// (one wgmma k-step kept in flight). The default is a wave-aware estimate (DefaultTune); the
// measured W3 tunings (bench/notes/igemm_w3.md: fp32 wg=3 stages=7, tf32 wg=4 stages=5) are
// what it picks for W3.
#include "codegen/igemm_strategy.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/strategy_util.h"
#include "codegen/tune_config.h"
#include "templates/geometry.cuh"

namespace fusejit::codegen {
namespace {

using fj::geom::kPrecBF16x1;
using fj::geom::kPrecF16x1;
using fj::geom::kPrecF16x1Scaled;
using fj::geom::kPrecF16x3;
using fj::geom::kPrecTF32x1;
// Values match fj::IgemmOut (templates/igemm_mma.cuh).
enum IgemmOut { kOutStoreY = 0, kOutChannelMoments = 1 };

// The three plans over one GEMM kernel: what follows it.
enum class Variant {
  kStore,           // no group_norm, no mean: the epilogue's values are y (bias, every op)
  kStoreNormalize,  // pre-norm values stored with tile moments, then normalized in place
  kMomentsMean,     // chain ends in group_norm | mean: per-channel moments only
};
IgemmOut OutOf(Variant v) { return v == Variant::kMomentsMean ? kOutChannelMoments : kOutStoreY; }

constexpr int kAbsmaxBlocks = 264;                 // IgemmPlanTune's kAbsmaxBlocks
constexpr int64_t kOptInSharedLimit = 227 * 1024;  // dynamic shared memory per block, sm_90
constexpr int64_t kSmSharedBytes = 228 * 1024;     // shared memory per SM, sm_90
constexpr int64_t kSharedPerBlockReserve = 1024;   // reserved by the system per resident block
constexpr int64_t kTileN = fj::geom::kIgemmTileN;  // the wide channel tile (wgmma n = 128)
constexpr int64_t kTileNSmall = fj::geom::kIgemmTileNSmall;  // the narrow one (n = 64)
constexpr int64_t kGnApplyThreads = 128, kGnApplyVec = 4;  // gn_apply.cuh GnApply
constexpr int64_t kMeanThreads = 256;                      // igemm_mean.cuh IgemmMean
constexpr int64_t kMeanMaxChannels = 1024;                 // igemm_mean.cuh static_assert
constexpr char kTuneType[] = "fj::IgemmPlanTune<IgemmFixed, IgemmTune>";

// Output channels padded to whole bn-channel tiles (IgemmShape::kCP).
int64_t PaddedChannels(int64_t c, int64_t bn) { return CeilDiv(c, bn) * bn; }

// The tunable parameters (the generated IgemmTune struct: igemm_wgmma.cuh's Tunables).
struct IgemmTune {
  int64_t wg = 3, stages = 7, async = 1;
  int64_t bn = kTileN;  // output channels per CTA: 128 or 64
  int64_t split = 1;    // the reduction's (kd, cb) blocks split this many ways (a second kernel
                        // adds the parts in a fixed order and runs the epilogue)
};
constexpr TuneField<IgemmTune> kIgemmFields[] = {
    {"wg", "kWG", &IgemmTune::wg},          {"stages", "kStages", &IgemmTune::stages},
    {"async", "kAsync", &IgemmTune::async}, {"bn", "kBN", &IgemmTune::bn},
    {"split", "kSplit", &IgemmTune::split},
};
std::span<const TuneField<IgemmTune>> Fields() { return kIgemmFields; }

// What the precision fixes (the generated IgemmFixed struct, with the epilogue).
struct IgemmPrecision {
  int prec = kPrecF16x3;
  int flush = 2;  // k-steps per short run of the accumulator (0: none)
  // Two 64-float accumulators per thread (the short run and the sum): at most 3 warpgroups.
  bool two_accumulators() const { return flush > 0; }
};
// f32 chains: the fp16 split (fp32-accurate) or TF32 when asked. bf16 and f16 chains: one product
// of their own values (exact operands). The tensor cores truncate as they accumulate (~1e-5
// relative over K = 1728, bench/notes/igemm_w3.md); a bf16/f16 output is rounded to 8 or 11 bits,
// 100x coarser, so its sum is not flushed (one accumulator: up to 4 warpgroups, no flush waits;
// W3 bf16 GEMM 0.78 -> 0.67 ms, H100 2026-11-26) -- except where the chain ends in a mean: that
// mean of a group_norm output is a near-cancelling sum whose error is relative to the channel
// terms, not to the (small) output, so it keeps the fp32-accurate sum unless TF32 was asked for;
// and where u is kept for the backward (PlanTarget::keeps_u): W3's f16 training forward saved u
// at 2.0e-6 relative unflushed against the f32 chain's 2.9e-7, and relu's kink at u made its
// gradients 3.5x the f16 rounding, past PyTorch's own (H100, 2026-11-28).
// An f32 chain's TF32 mode is the TF32 class on fp16 tensor cores (kPrecF16x1Scaled: each
// operand rounded to 11 significant bits, as TF32 rounds it, at twice TF32's rate), in blocks
// of 64 input channels, of which the products run in 16-channel slices; TF32 itself (blocks of
// 32) where the slices would pad the products by more than half, the blocks would more than
// double the bytes, or the prep's tile would not fit its static shared memory (above 320).
// x's values from which the TF32 class takes the fp16 rate where its 64-channel blocks are
// half padding (PrecisionOf): 4M values, 16 MB of f32.
constexpr int64_t kScaledBlocksMinValues = int64_t{1} << 22;
IgemmPrecision PrecisionOf(const Chain& chain, const PlanTarget& target) {
  const bool tf32 = target.precision == Precision::kTf32;
  const bool mean = !chain.ops.empty() && chain.ops.back().kind == OpKind::kMean;
  const int flush16 = tf32 || !(mean || target.keeps_u) ? 0 : 2;
  if (chain.dtype == DType::kBF16) return {kPrecBF16x1, flush16};
  if (chain.dtype == DType::kF16) return {kPrecF16x1, flush16};
  if (tf32) {
    const int64_t cin = chain.input.size() > 1 ? chain.input[1] : 0;
    const int64_t pad64 = CeilDiv(cin, 64) * 64;
    const int64_t pad16 = fj::geom::IgemmLiveChannels(cin, kPrecF16x1Scaled);
    const int64_t x_values = NumElements(chain.input);
    // Blocks that pad by more than half (32 channels: half of each block is zeros, whose
    // products are skipped) pay where x is large: [16,32,32^3] 0.465 -> 0.427 ms, but
    // [1,32,32^3] 0.040 -> 0.042 and a [8,40,12^3] 1x1 transposed conv 0.013 -> 0.020 ms, where
    // the absmax pass and prep cost more than the faster products save (H200, 2026-11-29).
    const bool fp16_rate = pad64 * 33 * 4 + 256 <= kStaticSharedLimit &&
                           (2 * pad64 <= 3 * cin || (2 * pad16 <= 3 * cin && pad64 <= 2 * cin &&
                                                     x_values >= kScaledBlocksMinValues));
    return {fp16_rate ? kPrecF16x1Scaled : kPrecTF32x1, 0};
  }
  return {kPrecF16x3, 2};
}

// The compile-time shapes of the templates for a chain and a tuning: IgemmShape, HaloShape and
// IgemmWgmmaShape from the same function (templates/geometry.cuh), plus GnApply's grid.
struct IgemmGeometry : fj::geom::Igemm {
  int64_t threads = 0;
  int64_t apply_blocks_per_row = 0;
};

IgemmGeometry Geometry(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                       const IgemmTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  // conv3d's stride (conv_transpose3d plans are stride 1: ChainSupported).
  const bool transposed = info.producer->kind == OpKind::kConvTranspose3d;
  const int64_t sh = transposed ? 1 : conv.stride[1], sw = transposed ? 1 : conv.stride[2];
  IgemmGeometry g;
  static_cast<fj::geom::Igemm&>(g) = fj::geom::IgemmOf(
      p[2], p[3], p[4], x[2], x[3], x[4], x[1], PaddedChannels(p[1], t.bn), conv.kernel[0],
      conv.kernel[1], conv.kernel[2], conv.dilation[1], conv.dilation[2], sh, sw,
      /*bm=*/64 * t.wg, t.bn, t.stages, PrecisionOf(chain, target).prec);
  g.threads = 128 * t.wg;
  const int64_t per_block =
      g.s % 4 == 0 ? kGnApplyThreads * kGnApplyVec * 4 : kGnApplyThreads * kGnApplyVec;
  g.apply_blocks_per_row = CeilDiv(g.s, per_block);
  return g;
}

// The channel tile: 64 where it cuts the padded products by at least a quarter (C = 64: half;
// 129-192 channels: a quarter), else 128 (less A traffic per product).
int64_t DefaultBn(const ChainInfo& info) {
  const int64_t c = info.producer_shape[1];
  return 4 * PaddedChannels(c, kTileNSmall) <= 3 * PaddedChannels(c, kTileN) ? kTileNSmall : kTileN;
}

// group_norm moments parts per group (geom::IgemmGroupParts: 1 where every group lies inside a
// channel tile; more where groups cross tile boundaries).
int64_t GroupParts(const ChainInfo& info, int64_t bn) {
  if (!info.group_norm) return 1;
  return fj::geom::IgemmGroupParts(info.producer_shape[1], info.group_norm->groups, bn);
}

// What the kernels support, independent of the tuning (each line mirrors a static_assert of the
// templates or a launch limit, so that Applies() never lets one fire).
bool ChainSupported(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                    Variant variant) {
  if (target.arch != "sm_90" && target.arch != "sm_90a") return false;  // wgmma: sm_90a build
  if (!info.producer) return false;
  if ((variant == Variant::kStore) != !info.group_norm) return false;
  const ConvAttrs& conv = info.producer->conv;
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  const int64_t n = p[0], c = p[1];
  if (variant == Variant::kStore) {
    if (info.mean != MeanMode::kNone) return false;
  } else if (variant == Variant::kStoreNormalize) {
    if (info.mean != MeanMode::kNone) return false;
    if (n * c > 65535) return false;  // grid.y of apply
  } else {
    // The mean of the normalized values follows from moments only without ops after the norm.
    if (info.mean == MeanMode::kNone || !info.post_ops.empty()) return false;
    if (c > kMeanMaxChannels) return false;  // the finalize's shared memory
  }
  // conv3d any stride (the halo holds the input rows the tile's strided points read);
  // conv_transpose3d stride 1 only (tc-conv splits strided ones into output phases).
  if (info.producer->kind == OpKind::kConvTranspose3d && conv.stride != Dims3{1, 1, 1}) {
    return false;
  }
  // A strided conv3d's halo is stride_h * stride_w times wider per output point and its points
  // serve kh*kw / (stride_h*stride_w) taps. Measured against tc-conv (H100, 2026-11-27, ms,
  // fp32-accurate / TF32): K11 (k 4, stride 2, 4 taps a point) 0.057 / 0.055 vs 0.152 / 0.046;
  // K5 (k 3: 2.25) 0.138 / 0.106 vs 0.139 / 0.091; K3 (k 2: 1) 0.109 / 0.083 vs 0.082 / 0.068.
  // So: at least 4 taps a halo point, fp32-accurate only.
  if (conv.stride != Dims3{1, 1, 1}) {
    if (PrecisionOf(chain, target).prec != kPrecF16x3) return false;
    if (conv.kernel[1] * conv.kernel[2] < 4 * conv.stride[1] * conv.stride[2]) return false;
  }
  // Input channels are zero-padded to whole blocks of 32 (64 for bf16/f16 chains) in the
  // prep's copies of x and the weights. Counts that are not multiples of 32 in fp32-accurate
  // (F16x3): the padded GEMM measured 1.9-2.0x faster than tc-conv; not in TF32 itself (32-channel
  // TF32 blocks: 1.07x to 0.66x, H100, 2026-11-26: S5, K8, T6 of bench/conv_engine_sweep.py).
  // Measured with 24-56 channels (padding 1.14-1.33x); at most 1.5x (22 channels and more).
  // One-product precisions (the TF32 class on fp16, bf16, f16) run the products of 16-channel
  // slices only (geom::IgemmSliceChannels: the last block's padding-only slices are skipped), so
  // they take counts whose slices pad the products by at most half and whose 64-channel blocks
  // at most double the bytes: K9 (200 channels), TF32 / bf16, was tc-conv's and below PyTorch's
  // (H200, 2026-11-28).
  const int prec = PrecisionOf(chain, target).prec;
  const bool packed16 = fj::geom::IgemmPrecX1(prec);
  const int64_t cin_pad = PaddedChannels(x[1], fj::geom::IgemmCinBlock(packed16));
  const int64_t cin_live = fj::geom::IgemmLiveChannels(x[1], prec);
  if (prec == kPrecTF32x1 && cin_pad != x[1]) return false;
  if (2 * cin_live > 3 * x[1] || cin_pad > 2 * x[1]) return false;
  if (cin_pad * 33 * 4 + 256 > kStaticSharedLimit) return false;  // prep's static smem tile
  // Output channels are padded to whole tiles of the default BN (zero weights, nothing stored,
  // no moments). The domain: the padding of both (input channels counted in blocks of 32, as
  // bf16/f16 chains' 64-channel blocks were accepted before) at most doubles the products (64
  // output channels on 128-channel tiles measured 2.1x faster than tc-conv: H100, 2026-11-26).
  const int64_t bn = DefaultBn(info);
  if (PaddedChannels(c, bn) * cin_live > 2 * c * x[1]) return false;
  if (conv.kernel[0] > 8) return false;                        // kKD <= 8 (kd list: 4 bits each)
  if (x[2] * x[3] * x[4] * x[1] * 4 >= (int64_t{1} << 31)) return false;  // sample too large
  if (p[3] * p[4] < 64) return false;  // BM <= kH*kW for one warpgroup
  if (n > 65535) return false;         // grid.z of the GEMM
  return true;
}

// The tuning-dependent checks: each mirrors a static_assert of the templates, the register file
// or the shared-memory limit.
absl::Status CheckTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                       const IgemmTune& t, const TuneConfig& c) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t taps_hw = conv.kernel[1] * conv.kernel[2];
  const int64_t plane = info.producer_shape[3] * info.producer_shape[4];
  if (t.wg < 1 || t.wg > 4) return Invalid(c, absl::StrCat("wg ", t.wg, " is not in [1, 4]"));
  if (t.bn != kTileN && t.bn != kTileNSmall) {
    return Invalid(c, absl::StrCat("bn ", t.bn, " is not ", kTileN, " or ", kTileNSmall));
  }
  if (PrecisionOf(chain, target).two_accumulators() && t.bn == kTileN && t.wg > 3) {
    return Invalid(c, absl::StrCat("wg ", t.wg, ": the fp32-accurate accumulators (2 x 64 "
                                   "per thread) do not fit the register file with ",
                                   128 * t.wg, " threads; at most 3 warpgroups"));
  }
  if (t.async != 0 && t.async != 1) {
    return Invalid(c, absl::StrCat("async is 0 or 1, not ", t.async));
  }
  const int64_t blocks = conv.kernel[0] * Geometry(chain, info, target, t).cb;  // (kd, cb) k-blocks
  if (t.split < 1 || t.split > std::min<int64_t>(fj::geom::kIgemmMaxSplit, blocks)) {
    return Invalid(c, absl::StrCat("split ", t.split, " is not in [1, ",
                                   std::min<int64_t>(fj::geom::kIgemmMaxSplit, blocks),
                                   "] (at most ", fj::geom::kIgemmMaxSplit, ", and at most the ",
                                   blocks, " (kd, channel block) steps of the reduction)"));
  }
  if (info.producer_shape[0] * t.split > 65535) {
    return Invalid(c, absl::StrCat("split ", t.split, ": ", info.producer_shape[0] * t.split,
                                   " samples x parts exceed the grid's 65535"));
  }
  if (t.stages < 2 || t.stages - 1 > taps_hw) {
    return Invalid(c, absl::StrCat("stages ", t.stages, " must be in [2, ", taps_hw + 1,
                                   "] (the next halo is issued stages-1 k-steps ahead, within the ",
                                   taps_hw, " kh x kw taps)"));
  }
  if (t.async == 1 && t.stages < 3) {
    return Invalid(c, absl::StrCat("async needs stages >= 3, not ", t.stages));
  }
  const IgemmGeometry g = Geometry(chain, info, target, t);
  if (g.bm > plane) {
    return Invalid(c, absl::StrCat("wg ", t.wg, ": a tile of ", g.bm,
                                   " rows spans more than two output planes of ", plane,
                                   " points"));
  }
  if (g.smem > kOptInSharedLimit) {
    return Invalid(c, absl::StrCat("needs ", g.smem, " bytes of shared memory, at most ",
                                   kOptInSharedLimit));
  }
  return absl::OkStatus();
}

// GEMM CTAs resident per SM: shared memory, threads, and registers (F16x3 ~192 per thread: two
// 64-float accumulators and the A fragments; TF32 ~168; 64-channel tiles half the accumulators).
int64_t CtasPerSm(const IgemmGeometry& g, const IgemmPrecision& p) {
  const int64_t by_smem = kSmSharedBytes / (g.smem + kSharedPerBlockReserve);
  const int64_t by_threads = 2048 / g.threads;
  const int64_t regs = g.bn == kTileN ? (p.two_accumulators() ? 192 : 168)
                                      : (p.two_accumulators() ? 128 : 104);
  const int64_t by_regs = 65536 / (g.threads * regs);
  return std::max<int64_t>(1, std::min({by_smem, by_threads, by_regs}));
}

// Estimated GEMM time in ns: waves of CTAs over the SMs, each wave taking a tile's rows plus a
// per-CTA overhead expressed in rows (barriers and weight stages per k-step, prologue, epilogue),
// a row costing its products at the tensor cores' fp16 rate (~990 TFLOP/s dense on the H100 at
// 75%: 5600 flop per ns and SM; TF32 half, F16x3 three products). Fitted to H100 timings
// (2026-11-22, fusejit autotune): F16x3 30 rows on W3 (128 vs 192 rows), 54 on W3-c and 108 on W4-f
// (128 vs 192 rows, 1 vs 2 waves and 6 vs 4); TF32 ~240 on W3 (192 vs 256 rows). Co-resident CTAs
// share an SM (0.85: they hide some of each other's latency). A split into `split` parts runs split
// times the CTAs, each with 1/split of the reduction, plus the second kernel: the parts written
// and read once at ~3 bytes per ns, and a launch (~3 us).
double EstimateTime(const IgemmGeometry& g, const IgemmPrecision& p, int64_t ctas_total,
                    int64_t sm_count, int64_t split) {
  const int64_t per_sm = CtasPerSm(g, p);
  const int64_t sms = std::max<int64_t>(1, sm_count);
  const int64_t waves = CeilDiv(ctas_total * split, sms * per_sm);
  const double overhead = p.two_accumulators() ? 96 : 192;
  const double products = p.prec == kPrecF16x3 ? 3 : p.prec == kPrecTF32x1 ? 2 : 1;
  // Whole channel blocks, also where one-product precisions skip the last block's padding-only
  // slices (geom::IgemmSliceChannels): counting only the live channels made the model drop a
  // 3-way split that measured 7% faster (T11 in f16, H200 2026-11-29).
  const double row_ns = static_cast<double>(g.bn * g.taps * g.cb * g.cin_block) * 2 * products / 5600;
  const double gemm = static_cast<double>(waves * per_sm) * (per_sm > 1 ? 0.85 : 1.0) *
                      (static_cast<double>(g.bm) + overhead) * row_ns / static_cast<double>(split);
  if (split == 1) return gemm;
  const double part_bytes = static_cast<double>(ctas_total * split * g.bm * g.bn) * 4 * 2;
  return gemm + part_bytes / 3000.0 + 3000.0;
}

// The heuristic tuning: for each tile height (warpgroups), the deepest weight pipeline that fits
// (at most the measured 7 stages, 5 for TF32) and the deepest one that lets more CTAs share an SM,
// each unsplit or split 2..8 ways; the one of least EstimateTime() (ties: larger tiles, deeper
// pipelines, fewer parts). Returns the smallest tuning when none fits (Applies() then says no).
IgemmTune DefaultTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target) {
  const IgemmPrecision p = PrecisionOf(chain, target);
  const bool one_acc = !p.two_accumulators();
  const ConvAttrs& conv = info.producer->conv;
  const int64_t bn = DefaultBn(info);
  // 64-channel tiles: at most two warpgroups, synchronous wgmma. Measured on the H100
  // (bench/notes/session19_2026-11-28.txt, `fusejit autotune`, six chains with 48-64 channels in
  // every precision): async=0 beat async=1 in every case (by 7-9% at equal wg and stages), and two
  // warpgroups with 3-4 stages were the fastest or within 1% of it (the defaults before, 3-4
  // warpgroups, async: 1.07-1.15x slower).
  const bool narrow = bn == kTileNSmall;
  const int64_t top_wg = narrow ? 2 : one_acc ? 4 : 3, top_stages = one_acc ? 5 : 7;
  const int64_t ctas_per_tile_row =
      info.producer_shape[0] * (PaddedChannels(info.producer_shape[1], bn) / bn);
  auto fits = [&](const IgemmTune& t) {
    return CheckTune(chain, info, target, t, TuneConfig{}).ok();
  };
  auto with_stages = [bn, narrow](int64_t wg, int64_t stages) {
    return IgemmTune{wg, stages, !narrow && stages >= 3 ? 1 : 0, bn, 1};
  };
  IgemmTune best{1, 2, 0, bn, 1};
  double best_est = 0;
  bool found = false;
  auto consider = [&](IgemmTune t) {
    const IgemmGeometry g = Geometry(chain, info, target, t);
    for (t.split = 1; t.split <= fj::geom::kIgemmMaxSplit; ++t.split) {
      if (t.split > 1 && !fits(t)) break;
      const double est =
          EstimateTime(g, p, g.tiles * ctas_per_tile_row, target.sm_count, t.split);
      if (!found || est < best_est * (1 - 1e-9)) {
        best = t;
        best_est = est;
        found = true;
      }
    }
  };
  for (int64_t wg = top_wg; wg >= 1; --wg) {
    IgemmTune deep =
        with_stages(wg, std::min<int64_t>(top_stages, conv.kernel[1] * conv.kernel[2] + 1));
    while (!fits(deep) && deep.stages > 2) deep = with_stages(wg, deep.stages - 1);
    if (!fits(deep)) continue;
    consider(deep);
    const int64_t deep_per_sm = CtasPerSm(Geometry(chain, info, target, deep), p);
    for (int64_t s = deep.stages - 1; s >= 2; --s) {
      const IgemmTune shallow = with_stages(wg, s);
      if (CtasPerSm(Geometry(chain, info, target, shallow), p) > deep_per_sm) {
        consider(shallow);
        break;
      }
    }
  }
  return best;
}

// The strategies' shared code: one class, three epilogues.
class IgemmStrategy : public Strategy {
 public:
  explicit IgemmStrategy(Variant variant) : variant_(variant), out_(OutOf(variant)) {}
  std::string_view name() const override {
    switch (variant_) {
      case Variant::kStore:
        return "igemm-store";
      case Variant::kStoreNormalize:
        return "igemm-store-normalize";
      case Variant::kMomentsMean:
        break;
    }
    return "igemm-moments-mean";
  }
  // bf16 and f16 chains natively: x and the weights encoded as their own 16-bit values (one
  // product), parameters read as the dtype, the output rounded once (igemm-store's epilogue
  // writes y in the dtype; the group_norm variants keep fp32 pre-norm values in a workspace).
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    if (!ChainSupported(in.chain, info, in.target, variant_)) return false;
    const IgemmTune t = DefaultTune(in.chain, info, in.target);
    return CheckTune(in.chain, info, in.target, t, ToConfig(name(), t, Fields())).ok();
  }
  double Cost(const PlanInput& in) const override {
    // The products on the tensor cores at several times the rate of the fp32 FFMA plans, x copied
    // once (8 bytes a point); store writes y once (4 bytes a point), store-normalize also reads
    // and writes it again (12 bytes a point), moments-mean writes nothing full-size.
    const ChainInfo& info = in.info;
    const double per_point = variant_ == Variant::kStore            ? 4.0 / 3.0
                             : variant_ == Variant::kStoreNormalize ? 12.0 / 3.0
                                                                    : 0.5;
    // Padded channels cost their share of the products. The rate holds while the grid keeps
    // about 3 warpgroups on every SM; fewer run the products proportionally slower (H100,
    // 2026-11-26: x:f32[4,256,8,8,8] | conv3d(out=256,k=3,padding=1), 64 one-warpgroup CTAs,
    // igemm-store 0.143 ms fp32-accurate and 0.165 TF32 against tc-conv's 0.232 and 0.120;
    // x:f32[2,160,12,12,12] | conv3d(out=80,k=3,padding=1) | swish | group_norm(groups=10) |
    // mean, igemm-moments-mean 0.110 / 0.120 against tc-conv's 0.110 / 0.077).
    const IgemmTune t = DefaultTune(in.chain, info, in.target);
    const int64_t cp = PaddedChannels(info.producer_shape[1], t.bn);
    const double padding =
        static_cast<double>(cp) / static_cast<double>(info.producer_shape[1]);
    const IgemmGeometry g = Geometry(in.chain, info, in.target, t);
    // A split runs its parts as more warpgroups, and writes and reads each part once (8 bytes a
    // point and part).
    const double warpgroups =
        static_cast<double>(g.tiles * (cp / t.bn) * info.producer_shape[0] * t.wg * t.split);
    const double fill = std::min(
        1.0, warpgroups / (3.0 * static_cast<double>(std::max<int64_t>(1, in.target.sm_count))));
    const double split_bytes = t.split > 1 ? 8.0 * static_cast<double>(t.split) * padding : 0.0;
    return static_cast<double>(info.elements) *
               (per_point + split_bytes / 3.0 +
                2.0 * info.macs_per_point * padding / (400.0 * fill)) +
           static_cast<double>(NumElements(in.chain.input)) * 8.0 / 3.0;
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), DefaultTune(in.chain, in.info, in.target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    return {{"wg", {1, 2, 3, 4}},
            {"stages", {2, 3, 4, 5, 6, 7, 8}},
            {"async", {0, 1}},
            {"bn", {kTileN, kTileNSmall}},
            {"split", {1, 2, 3, 4, 6, 8}}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<IgemmTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckTune(in.chain, in.info, in.target, *t, config);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override;

 private:
  absl::StatusOr<IgemmTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) {
      return Invalid(config, absl::StrCat("not an ", std::string(name()), " config"));
    }
    // Configurations written before bn and split existed (tuning databases) name wg, stages,
    // async (the 128-channel tile they were made for) or also bn: no split.
    if (config.values.size() >= 3 && config.values.size() < Fields().size()) {
      absl::StatusOr<IgemmTune> t = FromConfig(config, Fields().first(config.values.size()));
      if (t.ok()) return t;
    }
    return FromConfig(config, Fields());
  }

  Variant variant_;
  IgemmOut out_;
};

absl::StatusOr<Plan> IgemmStrategy::Build(const PlanInput& in, const TuneConfig& config) const {
  const ChainInfo& info = in.info;
  const IgemmTune t = *Parse(config);
  const IgemmPrecision pr = PrecisionOf(in.chain, in.target);
  const IgemmGeometry g = Geometry(in.chain, info, in.target, t);
  const bool f16 = pr.prec == kPrecF16x3;
  const bool x1 = pr.prec == kPrecBF16x1 || pr.prec == kPrecF16x1;
  // The fp16 encodings of an f32 chain's values: scaled (the absmax pass, 1/(sx*sw)).
  const bool scaled = fj::geom::IgemmPrecScaled(pr.prec);
  const bool scaled1 = pr.prec == kPrecF16x1Scaled;
  const std::string dtype_name(DTypeName(in.chain.dtype));
  // bf16/f16 chains store the pre-norm values in a float workspace, normalized into y.
  const bool store = variant_ == Variant::kStore;
  const bool pre_in_workspace = in.chain.dtype != DType::kF32 && !store;
  const bool moments = out_ == kOutChannelMoments;
  const bool mean_chain = info.mean != MeanMode::kNone;
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1], cin = in.chain.input[1];
  const int64_t groups = info.group_norm ? info.group_norm->groups : 0;
  Plan plan;
  plan.strategy = std::string(name());
  plan.description = absl::StrCat(
      "implicit GEMM on the tensor cores (wgmma, sm_90a): x copied channels-last in the operand "
      "encoding, each CTA stages its input rows once per (kd, channel block of ",
      g.cin_block,
      g.last_slices < g.slices ? absl::StrCat("; the last block's k-steps run ", g.last_slices,
                                              " of its ", g.slices, " slices of ", g.slice_channels,
                                              " channels, the rest being padding: ", g.cin_live,
                                              " of ", g.cb * g.cin_block, " channels multiplied")
                               : "",
      ") and streams the weights; ",
      moments ? "the epilogue writes per-tile per-channel moments of the pre-norm values "
                "(nothing full-size), merged in a fixed order (double) into the mean of the "
                "group_norm output, gamma_c (m_c - mu_g) rstd_g + beta_c. "
      : store ? "the epilogue applies bias and every op and stores y. "
      : pre_in_workspace
          ? "the epilogue stores the pre-norm values (fp32, a workspace) with per-tile group "
            "moments, merged in a fixed order, then normalizes them into y. "
          : "the epilogue stores the pre-norm values into y with per-tile group moments, "
            "merged in a fixed order, then y is normalized in place. ",
      f16       ? "fp32-accurate: fp16 high/low splits of x and w, three products, short-run "
                  "accumulator flushed every 2 k-steps"
      : x1      ? absl::StrCat("one ", dtype_name, " product per term (x and w are ", dtype_name,
                               " values: exact), ",
                          pr.flush > 0 ? (in.target.keeps_u && !mean_chain
                                                   ? "short-run accumulator flushed every 2 k-steps "
                                                     "(u is kept for the backward); "
                                                   : "short-run accumulator flushed every 2 k-steps; ")
                               : mean_chain ? "no flush (TF32 asked for); "
                                            : "fp32 accumulation (not flushed: the output's "
                                              "rounding is 100x coarser); ",
                               "the output rounded once")
      : scaled1 ? "TF32 class (asked for): x*sx and w*sw rounded to fp16 (11 significant bits, "
                  "as TF32 rounds them), one product per term at the fp16 rate"
                : "TF32 (asked for): one TF32 product per term");
  plan.includes = {"igemm_mma.cuh", "igemm_wgmma.cuh"};
  if (!store) plan.includes.push_back(moments ? "igemm_mean.cuh" : "gn_apply.cuh");
  plan.arch_override = "sm_90a";
  // IgemmFixed first: the last tune struct is the tunable one (its fields are the config's).
  plan.tunes.push_back({"IgemmFixed",
                        {TuneInt("kPrec", pr.prec), TuneInt("kFlushSteps", pr.flush),
                         TuneInt("kAbsmaxBlocks", kAbsmaxBlocks), TuneInt("kOut", out_)}});
  plan.tunes.push_back(ToTuneStruct("IgemmTune", t, Fields()));

  const size_t xa = plan.AddWorkspace(
      absl::StrCat("x channels-last [n][d][h][w][ci] as ",
                   f16       ? "fp16 high/low pairs of x*sx"
                   : scaled1 ? "fp16 x*sx, 64 channels per 128-byte block"
                   : x1      ? absl::StrCat(dtype_name, ", 64 channels per 128-byte block")
                             : "TF32",
                   cin % g.cin_block != 0 ? " (the last block's tail zeros)" : ""),
      static_cast<size_t>(n * g.xa_bytes_per_sample));
  const size_t wb = plan.AddWorkspace(
      absl::StrCat("weights [tap][co][ci] as ", f16       ? "fp16 high/low pairs of w*sw"
                                                : scaled1 ? "fp16 w*sw"
                                                : x1      ? dtype_name
                                                          : "TF32"),
      static_cast<size_t>(g.wb_bytes));
  size_t absmax = 0, scale = 0;
  if (scaled) {
    absmax = plan.AddWorkspace("per-block max|x| and max|w| (fp16 scales) x 264 blocks",
                               2 * kAbsmaxBlocks * 4);
    scale = plan.AddWorkspace("1/(sx*sw)", 4);
  }
  size_t partials = 0, stats = 0;
  if (moments) {
    partials = plan.AddWorkspace("per-tile channel moments (mean, M2 as doubles) x N*tiles*C",
                                 static_cast<size_t>(n * g.tiles * c) * 16);
  } else if (!store) {
    const int64_t parts = GroupParts(info, t.bn);
    partials = plan.AddWorkspace(
        absl::StrCat(
            "per-tile group moments (count, mean, M2) x N*groups*tiles",
            parts > 1 ? absl::StrCat("*", parts, " (a group's parts in each channel tile)") : ""),
        static_cast<size_t>(n * groups * parts * g.tiles) * 12);
    stats = plan.AddWorkspace("group statistics (mean, rstd) x N*groups",
                              static_cast<size_t>(n * groups) * 8);
  }
  size_t pre = 0;
  if (pre_in_workspace && !moments) {
    pre = plan.AddWorkspace("pre-norm values, fp32 (N*C*S*4 bytes)",
                            static_cast<size_t>(n * c * g.s) * 4);
  }
  const std::string tune = kTuneType;
  // Nulls: operands the precision does not use.
  const KernelArg x = KernelArg::Input();
  const KernelArg w = KernelArg::Param("weight", info.weight_param);
  const KernelArg absmax_in = scaled
                                  ? KernelArg::Workspace(ArgType::kFloat, "absmax", absmax, kRead)
                                  : KernelArg::Null(ArgType::kFloat, "absmax", kRead);
  const KernelArg scale_in = scaled ? KernelArg::Workspace(ArgType::kFloat, "scale", scale, kRead)
                                    : KernelArg::Null(ArgType::kFloat, "scale", kRead);
  if (scaled) {
    KernelLaunch k;
    k.symbol = "fj_igemm_absmax";
    k.body = absl::StrCat("fj::igemm_absmax_body<Cfg, ", tune, ">");
    k.purpose = f16 ? "per-block max|x| and max|w| (power-of-two scales for the fp16 splits)"
                    : "per-block max|x| and max|w| (power-of-two scales for the fp16 values)";
    k.grid = {kAbsmaxBlocks, 1, 1};
    k.block = {256, 1, 1};
    // xmax: an open slot (null: x is scanned) that codegen::ReadInputMaxima binds.
    k.args = {x, w, KernelArg::Null(ArgType::kFloat, "xmax", kRead),
              KernelArg::Workspace(ArgType::kFloat, "absmax", absmax, kWrite)};
    k.restrict_pointers = true;
    plan.kernels.push_back(k);
  }
  KernelLaunch prep;
  prep.symbol = "fj_igemm_prep";
  prep.body = absl::StrCat("fj::igemm_prep_body<Cfg, ", tune, ">");
  prep.purpose = f16 ? "x -> channels-last fp16 high/low pairs, weights -> [tap][co][ci] pairs"
                 : scaled1 ? "x -> channels-last fp16 x*sx, weights -> [tap][co][ci] fp16 w*sw"
                 : x1      ? absl::StrCat("x -> channels-last ", dtype_name,
                                          ", weights -> [tap][co][ci] ", dtype_name)
                           : "x -> channels-last TF32, weights -> [tap][co][ci] TF32";
  prep.grid = {static_cast<unsigned>(n * g.prep_x_blocks_per_sample + g.prep_w_blocks), 1, 1};
  prep.block = {256, 1, 1};
  prep.min_blocks_per_sm = 8;
  prep.args = {x,
               w,
               absmax_in,
               KernelArg::Workspace(ArgType::kBytes, "xa", xa, kWrite),
               KernelArg::Workspace(ArgType::kBytes, "wb", wb, kWrite),
               scaled ? KernelArg::Workspace(ArgType::kFloat, "scale", scale, kWrite)
                      : KernelArg::Null(ArgType::kFloat, "scale", kWrite)};
  prep.restrict_pointers = true;
  plan.kernels.push_back(prep);
  size_t kpart = 0;
  if (t.split > 1) {
    kpart = plan.AddWorkspace(
        absl::StrCat("the split's parts: ", t.split, " x ", g.bm, "x", t.bn,
                     " sums per (sample, channel tile, tile), fp32"),
        static_cast<size_t>(n * CeilDiv(c, t.bn) * g.tiles * t.split * g.bm * t.bn) * 4);
  }
  // The kernel with the epilogue: the GEMM itself, or with a split the GEMM writing its parts
  // and then this one, reading them (kpart instead of xa and wb), adding them and finishing.
  auto push_gemm = [&](KernelLaunch k) {
    if (t.split == 1) {
      plan.kernels.push_back(std::move(k));
      return;
    }
    KernelLaunch part = k;
    part.symbol = "fj_igemm_wgmma_split";
    part.body = absl::StrCat("fj::igemm_wgmma_split_body<Cfg, ", tune, ">");
    part.purpose =
        absl::StrCat("implicit GEMM ", g.bm, "x", t.bn, " tiles (wgmma), the reduction split ",
                     t.split, " ways over its (kd, channel block) steps: raw sums per part");
    part.grid[2] = static_cast<unsigned>(n * t.split);
    part.args = {k.args[0], k.args[1],
                 KernelArg::Workspace(ArgType::kFloat, "kpart", kpart, kWrite)};
    plan.kernels.push_back(part);
    const bool moments_out = k.symbol == "fj_igemm_wgmma_moments";
    k.symbol = moments_out ? "fj_igemm_reduce_moments" : "fj_igemm_reduce";
    k.body = absl::StrCat(moments_out ? "fj::igemm_wgmma_reduce_moments_body<Cfg, "
                                      : "fj::igemm_wgmma_reduce_body<Cfg, ",
                          tune, ">");
    const size_t after = k.purpose.find(" + ");
    k.purpose =
        absl::StrCat("add the ", t.split, " parts in part order, then",
                     after == std::string::npos ? ": " + k.purpose : k.purpose.substr(after + 2));
    k.shared_bytes = static_cast<unsigned>(g.epi_bytes);
    k.args.erase(k.args.begin(), k.args.begin() + 2);
    k.args.insert(k.args.begin(), KernelArg::Workspace(ArgType::kFloat, "kpart", kpart, kRead));
    plan.kernels.push_back(std::move(k));
  };
  KernelLaunch gemm;
  gemm.grid = {static_cast<unsigned>(g.tiles), static_cast<unsigned>(CeilDiv(c, t.bn)),
               static_cast<unsigned>(n)};
  gemm.block = {static_cast<unsigned>(g.threads), 1, 1};
  gemm.min_blocks_per_sm = 1;
  gemm.shared_bytes = static_cast<unsigned>(g.smem);
  gemm.args = {KernelArg::Workspace(ArgType::kBytes, "xa", xa, kRead),
               KernelArg::Workspace(ArgType::kBytes, "wb", wb, kRead),
               KernelArg::Param("bias", info.bias_param), scale_in};
  gemm.restrict_pointers = true;
  if (moments) {
    gemm.symbol = "fj_igemm_wgmma_moments";
    gemm.body = absl::StrCat("fj::igemm_wgmma_moments_body<Cfg, ", tune, ">");
    gemm.purpose = absl::StrCat("implicit GEMM ", g.bm, "x", t.bn,
                                " tiles (wgmma) + bias + pre-ops, per-tile channel moments "
                                "(nothing full-size stored)");
    gemm.args.push_back(
        KernelArg::Workspace(ArgType::kIgemmChannelMoments, "cpart", partials, kWrite));
    push_gemm(gemm);
    KernelLaunch fin;
    fin.symbol = "fj_igemm_mean";
    fin.body = absl::StrCat("fj::igemm_mean_finalize_body<Cfg, ", tune, ">");
    fin.purpose = "merge channel moments in a fixed order (double) -> group mean/rstd -> mean of "
                  "the group_norm output";
    fin.grid = {static_cast<unsigned>(n), 1, 1};
    fin.block = {static_cast<unsigned>(kMeanThreads), 1, 1};
    fin.args = {KernelArg::Workspace(ArgType::kIgemmChannelMoments, "cpart", partials, kRead),
                KernelArg::Param("gamma", info.gamma_param),
                KernelArg::Param("beta", info.beta_param), KernelArg::Output()};
    fin.restrict_pointers = true;
    plan.kernels.push_back(fin);
    return plan;
  }
  gemm.symbol = "fj_igemm_wgmma";
  gemm.body = absl::StrCat("fj::igemm_wgmma_body<Cfg, ", tune, ">");
  gemm.purpose = absl::StrCat("implicit GEMM ", g.bm, "x", t.bn,
                              " tiles (wgmma) + bias + pre-ops, pre-norm values into ",
                              pre_in_workspace ? "an fp32 workspace" : "y",
                              ", per-tile group moments");
  gemm.args.push_back(pre_in_workspace ? KernelArg::Workspace(ArgType::kFloat, "y", pre, kWrite)
                                       : KernelArg::Output());
  // u: where the training forward stores the convolution's output as well (null otherwise;
  // codegen::SaveProducerOutput binds it).
  if (store) {
    gemm.purpose = absl::StrCat("implicit GEMM ", g.bm, "x", t.bn,
                                " tiles (wgmma) + bias + every op, stored into y");
    gemm.args.push_back(KernelArg::Null(ArgType::kFloat, "partials", kWrite));
    gemm.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
    push_gemm(gemm);
    return plan;
  }
  gemm.args.push_back(KernelArg::Workspace(ArgType::kFloat, "partials", partials, kWrite));
  gemm.args.push_back(KernelArg::Null(ArgType::kFloat, "u", kWrite));
  push_gemm(gemm);
  KernelLaunch fin;
  fin.symbol = "fj_gn_finalize";
  fin.body = absl::StrCat("fj::gn_finalize_body<Cfg, ", g.tiles, ", ", t.bn, ">");
  fin.purpose = "merge each (sample, group)'s tile moments in a fixed order -> mean, rstd";
  fin.grid = {static_cast<unsigned>(n * groups), 1, 1};
  fin.block = {256, 1, 1};
  fin.args = {KernelArg::Workspace(ArgType::kFloat, "partials", partials, kRead),
              KernelArg::Workspace(ArgType::kFloat, "stats", stats, kWrite)};
  fin.restrict_pointers = true;
  plan.kernels.push_back(fin);
  KernelLaunch apply;
  apply.symbol = "fj_gn_apply";
  apply.body = pre_in_workspace ? "fj::gn_apply_out_body<Cfg>" : "fj::gn_apply_body<Cfg>";
  apply.purpose = pre_in_workspace
                      ? absl::StrCat("normalize, affine, post-ops, rounded once into y (",
                                     dtype_name, ")")
                      : "normalize y in place, affine, post-ops";
  apply.grid = {static_cast<unsigned>(g.apply_blocks_per_row), static_cast<unsigned>(n * c), 1};
  apply.block = {static_cast<unsigned>(kGnApplyThreads), 1, 1};
  apply.args = {KernelArg::Param("gamma", info.gamma_param),
                KernelArg::Param("beta", info.beta_param),
                KernelArg::Workspace(ArgType::kFloat, "stats", stats, kRead)};
  if (pre_in_workspace) {
    apply.args.push_back(KernelArg::Workspace(ArgType::kFloat, "pre", pre, kRead));
  }
  apply.args.push_back(KernelArg::Output());
  apply.restrict_pointers = true;
  plan.kernels.push_back(apply);
  return plan;
}

}  // namespace

void AddIgemmStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(std::make_unique<IgemmStrategy>(Variant::kStore));
  out->push_back(std::make_unique<IgemmStrategy>(Variant::kStoreNormalize));
  out->push_back(std::make_unique<IgemmStrategy>(Variant::kMomentsMean));
}

}  // namespace fusejit::codegen
