// tc-conv: the tensor-core convolution engine for every conv3d / conv_transpose3d chain of the
// grammar (templates/tc_conv.cuh + tc_moments.cuh, gn_apply.cuh). One implicit GEMM on mma.sync
// (sm_80 and later; transposed convolutions split into output phases), the pre-norm ops in its
// epilogue, then the tail the chain needs:
//   no group_norm, no mean      GEMM stores y                               (2 kernels)
//   no group_norm, mean         GEMM -> tile channel moments -> means       (4)
//   group_norm, no mean         GEMM stores pre-norm y + tile moments -> group stats -> y
//                               normalized in place with the post-ops       (5)
//   group_norm | mean (no post) GEMM -> tile channel moments -> mean from moments (4)
//   group_norm | ops | mean     GEMM stores pre-norm values in a workspace -> group stats ->
//                               per-row mean of post(normalized)            (5-6)
// Channels are padded, not refused: input channels to whole 16-byte segments (4 fp32 or 8 16-bit
// values; k-steps run across taps), output channels to the tile width kBN.
// Precision: kFp32 runs 3xTF32 (big/small TF32 split of both operands, three products; fp32
// accurate), kTf32 one TF32 product; bf16/f16 chains one bf16/f16 product (m16n8k16: their values
// multiply exactly, at twice TF32's rate).
// Tunable: bm (64, 128 output points per tile), bn (8..128 channels), bk (8, 16, 32: 32-bit
// words of the GEMM's k per pipeline step, over (tap, input channel): 8 to 32 fp32 values, 16 to
// 64 16-bit ones), stages (cp.async pipeline depth).
#include "codegen/tc_conv_strategy.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/strategy_util.h"
#include "codegen/tune_config.h"

namespace fusejit::codegen {
namespace {

// Values match fj::TcPrec and fj::TcOut (templates/tc_conv.cuh).
enum TcPrec { kPrecTF32 = 0, kPrec3xTF32 = 1, kPrec16 = 2 };
enum TcOut { kStoreFinal = 0, kStorePreNorm = 1, kMomentsOnly = 2 };
constexpr int64_t kMomentsBytes = 24;  // fj::TcChannelMoments

// Bytes of one GEMM operand element (fj::TcOpT), and the values a 32-bit word of a shared row
// holds (fj::TcShape::kElemsPerWord).
int64_t OperandBytes(TcPrec prec) { return prec == kPrec16 ? 2 : 4; }
int64_t ElemsPerWord(TcPrec prec) { return prec == kPrec16 ? 2 : 1; }
// Input channels padded to whole 16-byte segments (fj::TcShape::kCinPad).
int64_t CinPad(int64_t cin, TcPrec prec) {
  const int64_t vec = 16 / OperandBytes(prec);
  return CeilDiv(cin, vec) * vec;
}

struct TcTune {
  int64_t bm = 128, bn = 64, bk = 32, stages = 3, split = 1;
  int64_t wm = 32;  // rows of a warp's tile (32 or 64: fewer shared-memory reads a product)
  int64_t l1 = 0;   // input tiles through the L1 cache (cp.async.ca; re-read by later taps)
};
constexpr TuneField<TcTune> kTcFields[] = {
    {"bm", "kBM", &TcTune::bm},
    {"bn", "kBN", &TcTune::bn},
    {"bk", "kBK", &TcTune::bk},
    {"stages", "kStages", &TcTune::stages},
    {"split", "kSplit", &TcTune::split},
    {"wm", "kWarpRows", &TcTune::wm},
    {"l1", "kInputL1", &TcTune::l1, /*is_bool=*/true},
};
std::span<const TuneField<TcTune>> Fields() { return kTcFields; }

// The tail after the GEMM: what the chain needs (see the file comment).
struct TcPipeline {
  TcOut out = kStoreFinal;
  bool stats = false;     // group statistics for an in-place normalize or a row mean
  bool apply = false;     // gn_apply normalizes y in place
  bool row_mean = false;  // pre-norm values to a workspace, then tc_row_mean
  bool moments_mean = false;  // the mean follows from the channel moments (tc_finalize writes y)
};
TcPipeline PipelineOf(const ChainInfo& info) {
  TcPipeline p;
  const bool mean = info.mean != MeanMode::kNone;
  if (!info.group_norm) {
    p.out = mean ? kMomentsOnly : kStoreFinal;
    p.moments_mean = mean;
  } else if (!mean) {
    p.out = kStorePreNorm;
    p.stats = p.apply = true;
  } else if (info.post_ops.empty()) {
    p.out = kMomentsOnly;
    p.moments_mean = true;
  } else {
    p.out = kStorePreNorm;
    p.stats = p.row_mean = true;
  }
  return p;
}

// The template's derived sizes (fj::TcShape), computed the same way.
struct TcGeometry {
  int64_t warps_m = 0, warps_n = 0, threads = 0, cin_pad = 0, c_pad = 0, smem = 0;
  int64_t taps = 0, tiles = 0, prep_blocks = 0;
  double padded_macs = 0;  // multiply-adds the GEMM runs per sample (padding included)
};

// Output points of phase p along a dimension (TcDim::extent).
int64_t Extent(bool transposed, int64_t out, int64_t stride, int64_t p) {
  if (!transposed) return out;
  return p < out ? (out - p + stride - 1) / stride : 0;
}
// Taps of a dimension reaching phase p (TcDim::reaches).
int64_t TapsReaching(bool transposed, int64_t k, int64_t stride, int64_t pad, int64_t dil,
                     int64_t p) {
  if (!transposed) return k;
  int64_t n = 0;
  for (int64_t kk = 0; kk < k; ++kk) n += (((p + pad - kk * dil) % stride) + stride) % stride == 0;
  return n;
}

TcGeometry Geometry(const Chain& chain, const ChainInfo& info, const TcTune& t, TcPrec prec) {
  const ConvAttrs& conv = info.producer->conv;
  const bool tr = info.producer->kind == OpKind::kConvTranspose3d;
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  TcGeometry g;
  g.warps_m = std::max<int64_t>(1, t.bm / t.wm);
  g.warps_n = std::clamp<int64_t>(t.bn / 32, 1, 4);
  g.threads = 32 * g.warps_m * g.warps_n;
  g.cin_pad = CinPad(x[1], prec);                 // whole 16-byte segments; k-steps run across taps
  const int64_t bke = t.bk * ElemsPerWord(prec);  // k (values) per k-step
  g.c_pad = CeilDiv(p[1], t.bn) * t.bn;
  const int64_t b_tiles = prec == kPrec3xTF32 ? 2 : 1;  // weight big (and small) parts
  const int64_t stage_floats = (t.bm + b_tiles * t.bn) * (t.bk + 4);
  g.smem = 4 * std::max(t.stages * stage_floats, 2 * g.warps_m * t.bn + t.bn);
  g.taps = conv.kernel[0] * conv.kernel[1] * conv.kernel[2];
  const int64_t phd = tr ? conv.stride[0] : 1, phh = tr ? conv.stride[1] : 1,
                phw = tr ? conv.stride[2] : 1;
  for (int64_t pd = 0; pd < phd; ++pd) {
    for (int64_t ph = 0; ph < phh; ++ph) {
      for (int64_t pw = 0; pw < phw; ++pw) {
        const int64_t points = Extent(tr, p[2], conv.stride[0], pd) *
                               Extent(tr, p[3], conv.stride[1], ph) *
                               Extent(tr, p[4], conv.stride[2], pw);
        const int64_t taps =
            TapsReaching(tr, conv.kernel[0], conv.stride[0], conv.padding[0], conv.dilation[0], pd) *
            TapsReaching(tr, conv.kernel[1], conv.stride[1], conv.padding[1], conv.dilation[1], ph) *
            TapsReaching(tr, conv.kernel[2], conv.stride[2], conv.padding[2], conv.dilation[2], pw);
        const int64_t tiles = CeilDiv(points, t.bm);
        g.tiles += tiles;
        g.padded_macs += static_cast<double>(tiles * t.bm) *
                         static_cast<double>(CeilDiv(taps * g.cin_pad, bke) * bke) *
                         static_cast<double>(g.c_pad);
      }
    }
  }
  const int64_t sin = x[2] * x[3] * x[4];
  const int64_t weight_elems = g.taps * g.c_pad * g.cin_pad;
  // x: 32 x 32 tiles, or 256 points a block below 32 channels (TcShape::kPrepXBlocks)
  const int64_t x_blocks = g.cin_pad < 32 ? x[0] * CeilDiv(sin, 256)
                                          : x[0] * CeilDiv(sin, 32) * CeilDiv(g.cin_pad, 32);
  g.prep_blocks = x_blocks + std::min<int64_t>(CeilDiv(weight_elems, 256), 1024);
  return g;
}

// bf16/f16 chains: one product of the 16-bit values (exact in fp32).
TcPrec PrecOf(const Chain& chain, const PlanTarget& target) {
  if (chain.dtype == DType::kBF16 || chain.dtype == DType::kF16) return kPrec16;
  return target.precision == Precision::kTf32 ? kPrecTF32 : kPrec3xTF32;
}

// What the templates support, independent of the tuning.
bool ChainSupported(const Chain& chain, const ChainInfo& info, const PlanTarget& target) {
  if (!HasAmpereFeatures(target.arch)) return false;  // cp.async, mma.sync tf32
  if (!info.producer) return false;
  const ConvAttrs& conv = info.producer->conv;
  for (int i = 0; i < 3; ++i) {
    if (conv.kernel[i] > 8) return false;  // the per-dim tap lists
  }
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  const int64_t sin = x[2] * x[3] * x[4], s = p[2] * p[3] * p[4];
  if (x[0] > 65535) return false;                       // grid.z
  if (sin * Round4(x[1]) * 4 >= (int64_t{1} << 31))
    return false;                                       // int offsets in a sample
                                                        // (the fp32 operands' bound)
  if (s >= (int64_t{1} << 31) / 2) return false;        // int output offsets
  const TcPipeline pipe = PipelineOf(info);
  if (pipe.apply && p[0] * p[1] > 65535) return false;  // gn_apply's grid.y
  if (pipe.row_mean && p[0] * p[1] > (int64_t{1} << 31) - 1) return false;
  return true;
}

absl::Status CheckTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                       const TcTune& t, const TuneConfig& c) {
  if (t.bm != 64 && t.bm != 128) return Invalid(c, absl::StrCat("bm ", t.bm, " is 64 or 128"));
  if (t.bn != 8 && t.bn != 16 && t.bn != 32 && t.bn != 64 && t.bn != 128) {
    return Invalid(c, absl::StrCat("bn ", t.bn, " is 8, 16, 32, 64 or 128"));
  }
  if (t.bk != 8 && t.bk != 16 && t.bk != 32) {
    return Invalid(c, absl::StrCat("bk ", t.bk, " is 8, 16 or 32"));
  }
  if (t.stages < 2 || t.stages > 6) {
    return Invalid(c, absl::StrCat("stages ", t.stages, " is not in [2, 6]"));
  }
  if (t.wm != 32 && t.wm != 64) return Invalid(c, absl::StrCat("wm ", t.wm, " is 32 or 64"));
  if (t.wm > t.bm) return Invalid(c, absl::StrCat("wm ", t.wm, " exceeds bm ", t.bm));
  if (t.wm == 64 && PrecOf(chain, target) == kPrec3xTF32 &&
      t.bn / std::clamp<int64_t>(t.bn / 32, 1, 4) > 16) {
    return Invalid(c, absl::StrCat("wm 64 with 3xTF32 needs warp tiles at most 16 channels wide "
                                   "(accumulators and short runs: 2 x 64 registers)"));
  }
  if (t.split < 1 || t.split > 16) {
    return Invalid(c, absl::StrCat("split ", t.split, " is not in [1, 16]"));
  }
  const TcGeometry g = Geometry(chain, info, t, PrecOf(chain, target));
  if ((t.bm * t.bk / 4) % g.threads != 0 || t.bm * t.bk / 4 < g.threads) {
    return Invalid(c, absl::StrCat("the ", t.bm, "x", t.bk, " input tile's 16-byte segments do "
                                   "not divide among ", g.threads, " threads (larger bk or bm)"));
  }
  const int64_t limit = SharedOptInLimit(target.arch);
  if (g.smem > limit) {
    return Invalid(c, absl::StrCat("needs ", g.smem, " bytes of shared memory, at most ", limit,
                                   " on ", target.arch));
  }
  if (g.tiles < 1 || g.tiles > (int64_t{1} << 31) - 1) {
    return Invalid(c, absl::StrCat(g.tiles, " tiles per sample do not fit grid.x"));
  }
  if (g.c_pad / t.bn * t.split > 65535) return Invalid(c, "too many channel tiles for grid.y");
  if (g.prep_blocks > (int64_t{1} << 31) - 1) return Invalid(c, "prep grid too large");
  return absl::OkStatus();
}

// Estimated GEMM time (arbitrary units): the padded multiply-adds in waves of CTAs over the SMs,
// plus a per-k-step overhead (barrier, address arithmetic) that favors larger bk.
double EstimateGemm(const TcGeometry& g, const TcTune& t, const Chain& chain, const PlanTarget& target) {
  const int64_t n = chain.input[0];
  const int64_t ctas = g.tiles * (g.c_pad / t.bn) * n * t.split;
  const int64_t per_sm = std::max<int64_t>(
      1, std::min({(228 * 1024) / (g.smem + 1024), 2048 / g.threads, int64_t{8}}));
  const double waves =
      std::ceil(static_cast<double>(ctas) / static_cast<double>(target.sm_count * per_sm));
  const double fill = static_cast<double>(ctas) / (waves * target.sm_count * per_sm);
  // Latency hiding: resident warps per SM and pipeline depth.
  const double warps = static_cast<double>(per_sm * g.threads / 32);
  const double work = g.padded_macs * static_cast<double>(n) * (1.0 + 6.0 / t.bk) *
                      (1.0 + 16.0 / t.bn) * (1.0 + 16.0 / t.bm) * (1.0 + 4.0 / warps) *
                      (1.0 + 0.5 / t.stages);
  return work / std::max(0.05, fill);
}

// The heuristic tuning, fitted to `fusejit autotune` on the lent H100 (2026-11-23, 8 sweep chains
// x both precisions, bench/notes/tc_conv_tuning.md): 128-point tiles (64 only when the device
// would not be half full even split); 32 or 64 channels a tile, whichever pads C less (64 on a tie
// when it still gives a CTA an SM; 16 for C <= 16, 8 for C <= 8: one mma n8 tile, half the
// products, 0.3-16% faster on 12 of 13 chains and 2% slower on one, H200 2026-11-29,
// bench/notes/session28_run1_2026-11-29.txt);
// split-K (2-16, at least 2 (3xTF32) or 4 k-steps each) while the tiles give fewer than 16 (3xTF32)
// or 8 warps an SM; warp tiles of 32 rows (64: ~5% on S1, tunable); the k-step that wastes the
// least on padding, where k-steps of 8 and 16 cost ~30% and ~10% more per product than 32, and
// 3xTF32's 32-wide k-steps (twice the weight tiles in shared memory) ~15% more below 128 input
// channels; 3 stages for 3xTF32, 4 for TF32 (2 on large grids, with the input through L1, below).
// Falls back to the valid configuration of least EstimateGemm().
TcTune DefaultTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target) {
  const TcPrec prec = PrecOf(chain, target);
  const bool three_products = prec == kPrec3xTF32;
  const int64_t epw = ElemsPerWord(prec);
  const int64_t cin = chain.input[1], c = info.producer_shape[1], n = chain.input[0];
  TcTune t;
  t.stages = three_products ? 3 : 4;
  double best_bk = 0;
  const ConvAttrs& conv = info.producer->conv;
  const bool tr = info.producer->kind == OpKind::kConvTranspose3d;
  const int64_t phases = tr ? conv.stride[0] * conv.stride[1] * conv.stride[2] : 1;
  const int64_t taps = std::max<int64_t>(
      1, conv.kernel[0] * conv.kernel[1] * conv.kernel[2] / phases);  // a phase's, about
  for (int64_t bk : {32, 16, 8}) {
    const double eff = bk == 8 ? 0.7 : bk == 16 ? 0.9 : (three_products && cin < 128 ? 0.85 : 1.0);
    const double useful =
        static_cast<double>(taps * cin) /
        static_cast<double>(CeilDiv(taps * CinPad(cin, prec), bk * epw) * bk * epw);
    if (useful * eff > best_bk * (1 + 1e-9)) {
      best_bk = useful * eff;
      t.bk = bk;
    }
  }
  auto ctas = [&](const TcTune& v) {
    const TcGeometry g = Geometry(chain, info, v, PrecOf(chain, target));
    return g.tiles * (g.c_pad / v.bn) * n;
  };
  bool wide_split = false;  // a 64-channel tile on a small grid, filled by split-K (below)
  if (c <= 16) {
    t.bn = c <= 8 ? 8 : 16;
  } else {
    const int64_t pad32 = CeilDiv(c, 32) * 32, pad64 = CeilDiv(c, 64) * 64;
    TcTune wide = t, narrow = t;
    wide.bn = 64;
    narrow.bn = 32;
    t.bn = pad64 < pad32 || (pad64 == pad32 && ctas(wide) >= target.sm_count) ? 64 : 32;
    // One-product precisions on a grid that does not fill the device even with 32-channel
    // tiles: the wider 128 x 64 tile (A reused twice as often) with split-K to fill it, unless
    // it pads the channels by more than a quarter more (`fusejit autotune`, H100 2026-11-26,
    // TF32: x:f32[4,256,8,8,8] | conv3d(out=256,k=3,padding=1) 0.120 -> 0.100 ms with bm 128,
    // bn 64, split 4; [4,200,8^3] conv 200->200 | group_norm 0.139 -> 0.103 with bn 128, split 4).
    wide_split = !three_products && ctas(narrow) < target.sm_count && 4 * pad64 <= 5 * pad32;
    if (wide_split) t.bn = 64;
  }
  // Split-K while the tiles leave the SMs short of warps: a CTA's k-steps run one after another,
  // each waiting on its loads, so a small grid runs at the latency of its k-step chain. Split
  // (by powers of two, at most 16 ways; not below 8 k-steps) until 16 warps an SM with 3xTF32,
  // whose k-steps cost three products and the splits (at least 2 k-steps a split), 8 with one
  // product (at least 4). Fitted on 107
  // chains' plans forced both ways (H200, 2026-11-30, bench/notes/session31_runs_2026-11-30.txt):
  // 3xTF32 [1,20,16^3] conv_transpose3d k5 -> 8 | group_norm | clamp | mean 0.152 -> 0.046 ms
  // (split 2 -> 16), [8,64,7^3] conv_transpose3d k4 -> 64 | relu | group_norm 0.158 -> 0.055
  // (4 -> 16); one product: splitting past 8 warps an SM, or below 4 k-steps a split, measured
  // 2-31% slower (partial tiles' round trip). bm = 128 was as fast or faster than 64 at the
  // best split in every chain measured both ways. Not modeled: a split past one wave of resident
  // CTAs (bf16 [1,128,39,16,23] conv3d k5 -> 16 | group_norm: split 3, 255 CTAs, 0.099 ms; split
  // 4 0.125); capping the split at one wave measured slower on most other chains.
  const int64_t ksteps = CeilDiv(taps * CinPad(cin, prec), t.bk * epw);
  const int64_t warps_wanted = (three_products ? 16 : 8) * target.sm_count;
  const auto split_for = [&](const TcTune& v) {
    const TcGeometry g = Geometry(chain, info, v, prec);
    const int64_t warps = ctas(v) * (g.threads / 32);
    const int64_t max_split =
        ksteps < 8 ? 1 : std::min<int64_t>(16, ksteps / (three_products ? 2 : 4));
    int64_t sp = 1;
    while (sp * 2 <= max_split && warps * sp < warps_wanted) sp *= 2;
    return sp;
  };
  t.bm = 128;
  t.split = split_for(t);
  // 64-row tiles where even split 128-row tiles give fewer than one CTA an SM (two a tile's
  // worth: few k-steps to split).
  if (!wide_split && ctas(t) * t.split * 2 < target.sm_count) {
    t.bm = 64;
    t.split = split_for(t);
  }
  // The input through L1 (later taps re-read it): TF32 on large grids with 2 stages (more L1
  // and more CTAs: S1 0.77 -> 0.70 ms, S2 1.26 -> 1.12), and every chain of <= 16 input channels
  // (B4: 0.102 -> 0.070 ms TF32, 0.120 -> 0.087 fp32); neutral elsewhere.
  if (!three_products) {
    t.l1 = 1;
    if (ctas(t) >= 2 * target.sm_count) t.stages = 2;
  } else if (cin <= 16) {
    t.l1 = 1;
  }
  if (CheckTune(chain, info, target, t, TuneConfig{}).ok()) return t;
  TcTune best;
  double best_cost = 0;
  bool found = false;
  for (int64_t bm : {128, 64}) {
    for (int64_t bn : {128, 64, 32, 16, 8}) {
      for (int64_t bk : {32, 16, 8}) {
        for (int64_t stages : {4, 3, 2}) {
          const TcTune v{bm, bn, bk, stages, 1, 32, 0};
          if (!CheckTune(chain, info, target, v, TuneConfig{}).ok()) continue;
          const double cost =
              EstimateGemm(Geometry(chain, info, v, PrecOf(chain, target)), v, chain, target);
          if (!found || cost < best_cost * (1 - 1e-9)) {
            best = v;
            best_cost = cost;
            found = true;
          }
        }
      }
    }
  }
  return best;
}

class TcConvStrategy : public Strategy {
 public:
  std::string_view name() const override { return "tc-conv"; }
  // bf16 and f16 chains natively: x, weights and parameters read as the dtype (one exact TF32
  // product), the output rounded once; group_norm chains keep fp32 pre-norm values in a
  // workspace, normalized into y.
  bool HandlesDType(DType dtype) const override {
    return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
  }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    if (!ChainSupported(in.chain, info, in.target)) return false;
    const TcTune t = DefaultTune(in.chain, info, in.target);
    return CheckTune(in.chain, info, in.target, t, ToConfig(name(), t, Fields())).ok();
  }
  double Cost(const PlanInput& in) const override {
    // In the planner's units (picoseconds on the H100: GenericCost's bytes / 3 is 3 TB/s): the
    // GEMM's padded multiply-adds at the measured rate of large, full-device tiles (2026-11-23,
    // bench/conv_engine_sweep.py S2: 3xTF32 0.045 ps, TF32 0.020 ps a multiply-add), slower with
    // fewer CTAs; the channels-last copy of x; the tail's full-size traffic; and
    // ~3 us of launches. bf16/f16 products: TF32's rate doubled, not yet fitted.
    const ChainInfo& info = in.info;
    const TcTune t = DefaultTune(in.chain, info, in.target);
    const TcPrec prec = PrecOf(in.chain, in.target);
    const TcGeometry g = Geometry(in.chain, info, t, prec);
    const TcPipeline pipe = PipelineOf(info);
    const double ps_per_mac = prec == kPrec3xTF32 ? 0.045 : prec == kPrec16 ? 0.010 : 0.020;
    const double ctas =
        static_cast<double>(g.tiles * (g.c_pad / t.bn) * in.chain.input[0] * t.split);
    // Fewer CTAs than two an SM: measured slower by about fill^-0.75 (S8, K9: 0.42 -> 1.9x).
    const double fill = std::pow(std::min(1.0, ctas / (2.0 * in.target.sm_count)), 0.75);
    // An 8-channel tile halves the padded products but not the A tile's loads and splits: it
    // measured 0.3-16% faster than the 16-channel one (H200, 2026-11-29,
    // bench/notes/session28_run1_2026-11-29.txt), so its products count 1.8x (10% below the
    // 16-wide tile's cost): at the full halving, [8,8,13,25,15] conv_transpose3d k5 -> 4 |
    // group_norm moved to tc-conv at 0.127 ms from convt-store-normalize's 0.091 (run 3).
    const double tile_rate = t.bn == 8 ? 1.8 : 1.0;
    const double gemm =
        g.padded_macs * static_cast<double>(in.chain.input[0]) * ps_per_mac * tile_rate / fill;
    double bytes_per_point = pipe.out == kMomentsOnly ? 0.2 : 4.0;
    if (pipe.apply) bytes_per_point += 8.0;
    if (pipe.row_mean) bytes_per_point += 4.0;
    const double in_bytes =
        static_cast<double>(NumElements(in.chain.input)) *
        (4.0 + 2.0 * static_cast<double>(OperandBytes(prec) * g.cin_pad) / in.chain.input[1]);
    return static_cast<double>(info.elements) * bytes_per_point / 3.0 + in_bytes / 3.0 + gemm +
           3e6;
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), DefaultTune(in.chain, in.info, in.target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    return {{"bm", {64, 128}},
            {"bn", {8, 16, 32, 64, 128}},
            {"bk", {8, 16, 32}},
            {"stages", {2, 3, 4, 5}},
            {"split", {1, 2, 4, 8, 16}},
            {"wm", {32, 64}},
            {"l1", {0, 1}}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<TcTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckTune(in.chain, in.info, in.target, *t, config);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override;

 private:
  absl::StatusOr<TcTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a tc-conv config");
    return FromConfig(config, Fields());
  }
};

absl::StatusOr<Plan> TcConvStrategy::Build(const PlanInput& in, const TuneConfig& config) const {
  const ChainInfo& info = in.info;
  const TcTune t = *Parse(config);
  const TcPrec prec = PrecOf(in.chain, in.target);
  const TcGeometry g = Geometry(in.chain, info, t, prec);
  const TcPipeline pipe = PipelineOf(info);
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  const int64_t groups = info.group_norm ? info.group_norm->groups : 0;
  const int64_t sin = in.chain.input[2] * in.chain.input[3] * in.chain.input[4];
  const int64_t s = info.producer_shape[2] * info.producer_shape[3] * info.producer_shape[4];
  const bool transposed = info.producer->kind == OpKind::kConvTranspose3d;
  // bf16/f16 chains with group_norm: the pre-norm values go to an fp32 workspace, not into y.
  const bool pre_in_workspace = pipe.apply && in.chain.dtype != DType::kF32;

  Plan plan;
  plan.strategy = std::string(name());
  plan.description = absl::StrCat(
      "implicit GEMM on the tensor cores (mma.sync, cp.async ", t.stages, "-stage pipeline), ",
      t.bm, " output points x ", t.bn, " channels per tile, k-steps of ", t.bk * ElemsPerWord(prec),
      " (tap, input channel) pairs", t.l1 ? ", the input through L1" : "",
      transposed ? ", the transposed convolution split into output phases (only the taps that "
                   "reach a phase)"
                 : "",
      t.split > 1 ? absl::StrCat(", split-K over ", t.split,
                                 " CTAs a tile (partials summed in split order by the tile's "
                                 "last CTA: deterministic)")
                  : "",
      "; input channels padded ", in.chain.input[1], " -> ", g.cin_pad,
      " (k-steps run across taps), output channels ", c, " -> ", g.c_pad, " (",
      static_cast<int64_t>(100.0 * info.macs_per_point * c * s * n /
                           std::max(1.0, g.padded_macs * n)),
      "% of the products useful). ",
      prec == kPrec3xTF32 ? "fp32-accurate: 3xTF32 (big/small TF32 splits, three products, "
                            "short runs added to the accumulator every 2 k8 steps)"
      : prec == kPrec16
          ? absl::StrCat("one ", DTypeName(in.chain.dtype), " product per term (m16n8k16; ",
                         DTypeName(in.chain.dtype),
                         " operands, exact products, fp32 accumulation",
                         in.target.keeps_u ? " in short runs (u is kept for the backward)" : "",
                         "), the output rounded once")
          : "TF32 (asked for): one TF32 product per term",
      ". Then: ",
      pre_in_workspace    ? "pre-norm values stored into an fp32 workspace with tile moments -> "
                            "group statistics -> normalized into y"
      : pipe.apply        ? "pre-norm values stored into y with tile moments -> group statistics "
                            "-> y normalized in place"
      : pipe.row_mean     ? "pre-norm values stored into a workspace with tile moments -> group "
                            "statistics -> per-row mean of the normalized, post-op values"
      : pipe.moments_mean ? "tile channel moments only (nothing full-size) -> the mean"
                          : "the ops' results stored into y");
  plan.includes = {"tc_conv.cuh", "tc_moments.cuh"};
  if (pipe.apply) plan.includes.push_back("gn_apply.cuh");
  // TcFixed first: the last tune struct is the tunable one (its fields are the config's).
  plan.tunes.push_back({"TcFixed",
                        {{"int", "kPrec", absl::StrCat(prec)},
                         {"int", "kOut", absl::StrCat(pipe.out)},
                         {"int", "kWarpsM", absl::StrCat(g.warps_m)},
                         {"int", "kWarpsN", absl::StrCat(g.warps_n)},
                         // 16-bit sums in short runs where the training forward keeps u
                         {"int", "kFlush16", prec == kPrec16 && in.target.keeps_u ? "1" : "0"},
                         // checked against fj::TcShape's own at compile time
                         {"int", "kHostTiles", absl::StrCat(g.tiles)},
                         {"int", "kHostSmemBytes", absl::StrCat(g.smem)},
                         {"int", "kHostPrepBlocks", absl::StrCat(g.prep_blocks)}}});
  plan.tunes.push_back(ToTuneStruct("TcTune", t, Fields()));
  const std::string tpl = "<Cfg, TcFixed, TcTune>";

  // The GEMM operands (fj::TcOpT): float, or the chain's 16-bit dtype.
  const int64_t op_bytes = OperandBytes(prec);
  const ArgType op_type = prec == kPrec16 ? ArgType::kTensorDType : ArgType::kFloat;
  const size_t xcl = plan.AddWorkspace(
      absl::StrCat("x channels-last [n][d][h][w][ci padded]",
                   prec == kPrec16 ? absl::StrCat(", ", DTypeName(in.chain.dtype)) : ""),
      static_cast<size_t>(n * sin * g.cin_pad * op_bytes));
  const size_t weight_bytes = static_cast<size_t>(g.taps * g.c_pad * g.cin_pad * op_bytes);
  const bool three_products = prec == kPrec3xTF32;
  const size_t wt = plan.AddWorkspace(
      three_products ? "weights [tap][co padded][ci padded], TF32 big parts"
      : prec == kPrec16
          ? absl::StrCat("weights [tap][co padded][ci padded], ", DTypeName(in.chain.dtype))
          : "weights [tap][co padded][ci padded], TF32-rounded",
      weight_bytes);
  const size_t wts =
      three_products ? plan.AddWorkspace("weights, TF32 small parts (w - big)", weight_bytes) : 0;
  size_t cpart = 0, chm = 0, stats = 0, z = 0, rows = 0;
  if (pipe.out != kStoreFinal) {
    cpart = plan.AddWorkspace("per-tile channel moments (count, mean, M2 as doubles) x N*tiles*C",
                              static_cast<size_t>(n * g.tiles * c * kMomentsBytes));
    chm = plan.AddWorkspace("channel moments x N*C", static_cast<size_t>(n * c * kMomentsBytes));
  }
  if (pipe.stats) {
    stats = plan.AddWorkspace("group statistics (mean, rstd) x N*groups",
                              static_cast<size_t>(n * groups) * 8);
  }
  if (pipe.row_mean || pre_in_workspace) {
    z = plan.AddWorkspace("pre-norm values [N][C][D][H][W]", static_cast<size_t>(info.elements) * 4);
    if (info.mean == MeanMode::kAll) {
      rows = plan.AddWorkspace("per-(n, c) means (double)", static_cast<size_t>(n * c) * 8);
    }
  }
  size_t kpart = 0, counters = 0;
  const int64_t c_tiles = g.c_pad / t.bn;
  if (t.split > 1) {
    kpart = plan.AddWorkspace(
        absl::StrCat("split-K partial tiles (", t.split, " per tile) x N*tiles*C tiles"),
        static_cast<size_t>(n * g.tiles * c_tiles * t.split * t.bm * t.bn) * 4);
    counters = plan.AddWorkspace("split-K tile counters (zeroed by the prep kernel)",
                                 static_cast<size_t>(n * g.tiles * c_tiles) * 4);
  }
  const KernelArg counters_arg =
      t.split > 1 ? KernelArg::Workspace(ArgType::kInt, "counters", counters, kWrite)
                  : KernelArg::Null(ArgType::kInt, "counters", kWrite);
  const KernelArg cpart_arg =
      KernelArg::Workspace(ArgType::kTcChannelMoments, "cpart", cpart, kWrite);

  KernelLaunch prep;
  prep.symbol = "fj_tc_prep";
  prep.body = absl::StrCat("fj::tc_prep_body", tpl);
  prep.purpose = "x -> channels-last (channels zero-padded), weights -> [tap][co][ci]";
  prep.grid = {static_cast<unsigned>(g.prep_blocks), 1, 1};
  prep.block = {256, 1, 1};
  prep.args = {KernelArg::Input(),
               KernelArg::Param("weight", info.weight_param),
               KernelArg::Workspace(op_type, "xcl", xcl, kWrite),
               KernelArg::Workspace(op_type, "wt", wt, kWrite),
               three_products ? KernelArg::Workspace(ArgType::kFloat, "wts", wts, kWrite)
                     : KernelArg::Null(ArgType::kFloat, "wts", kWrite),
               counters_arg};
  prep.restrict_pointers = true;
  plan.kernels.push_back(prep);

  KernelLaunch gemm;
  gemm.symbol = "fj_tc_conv";
  gemm.body = absl::StrCat("fj::tc_conv_body", tpl);
  gemm.purpose = absl::StrCat("implicit GEMM ", t.bm, "x", t.bn, " tiles (mma.sync) + bias + ",
                              info.group_norm ? "pre-norm ops" : "ops",
                              pipe.out == kStoreFinal     ? ", y stored"
                              : pipe.out == kMomentsOnly ? ", per-tile channel moments"
                                                          : ", stored with per-tile channel moments");
  gemm.grid = {static_cast<unsigned>(g.tiles), static_cast<unsigned>(c_tiles * t.split),
               static_cast<unsigned>(n)};
  gemm.block = {static_cast<unsigned>(g.threads), 1, 1};
  gemm.shared_bytes = static_cast<unsigned>(g.smem);
  gemm.args = {KernelArg::Workspace(op_type, "xcl", xcl, kRead),
               KernelArg::Workspace(op_type, "wt", wt, kRead),
               three_products ? KernelArg::Workspace(ArgType::kFloat, "wts", wts, kRead)
                     : KernelArg::Null(ArgType::kFloat, "wts", kRead),
               KernelArg::Param("bias", info.bias_param)};
  if (pipe.row_mean || pre_in_workspace) {
    gemm.args.push_back(KernelArg::Workspace(ArgType::kFloat, "dst", z, kWrite));
  } else if (pipe.out == kMomentsOnly) {
    gemm.args.push_back(KernelArg::Null(ArgType::kFloat, "dst", kWrite));  // null
  } else {
    gemm.args.push_back(KernelArg::Output("dst"));
  }
  gemm.args.push_back(pipe.out == kStoreFinal
                          ? KernelArg::Null(ArgType::kTcChannelMoments, "cpart", kWrite)
                          : cpart_arg);
  gemm.args.push_back(t.split > 1
                          ? KernelArg::Workspace(ArgType::kFloat, "kpart", kpart, kWrite)
                          : KernelArg::Null(ArgType::kFloat, "kpart", kWrite));
  gemm.args.push_back(counters_arg);
  // u: where the training forward stores the convolution's output as well (null otherwise;
  // codegen::SaveProducerOutput binds it). Not offered by the moments-only form, which stores
  // nothing full-size: its tiling (often split-K, the epilogue in a tile's last CTA) with u's
  // store added measured slower than the alternatives (H200, 2026-11-29: the sweep's K7 bf16
  // training step 0.72 -> 0.91 ms against recomputing u, S12 f32 0.64 -> 0.90 against the
  // composite training forward).
  gemm.args.push_back(
      KernelArg::Null(ArgType::kFloat, pipe.out == kMomentsOnly ? "u_not_offered" : "u", kWrite));
  gemm.restrict_pointers = true;
  plan.kernels.push_back(gemm);
  if (pipe.out == kStoreFinal) return plan;

  KernelLaunch merge;
  merge.symbol = "fj_tc_channel_merge";
  merge.body = absl::StrCat("fj::tc_channel_merge_body<Cfg, ", g.tiles, ">");
  merge.purpose = "merge each channel's tile moments in tile order (double)";
  merge.grid = {static_cast<unsigned>(CeilDiv(c, 8)), static_cast<unsigned>(n), 1};
  merge.block = {256, 1, 1};
  merge.args = {KernelArg::Workspace(ArgType::kTcChannelMoments, "cpart", cpart, kRead),
                KernelArg::Workspace(ArgType::kTcChannelMoments, "chm", chm, kWrite)};
  merge.restrict_pointers = true;
  plan.kernels.push_back(merge);

  KernelLaunch fin;
  fin.symbol = "fj_tc_finalize";
  fin.body = "fj::tc_finalize_body<Cfg>";
  fin.purpose = pipe.moments_mean
                    ? (info.group_norm ? "channel moments -> group mean/rstd -> mean of the "
                                         "group_norm output"
                                       : "channel moments -> mean")
                    : "channel moments merged per group in channel order -> mean, rstd";
  fin.grid = {static_cast<unsigned>(n), 1, 1};
  fin.block = {256, 1, 1};
  fin.args = {KernelArg::Workspace(ArgType::kTcChannelMoments, "chm", chm, kRead),
              KernelArg::Param("gamma", info.gamma_param),
              KernelArg::Param("beta", info.beta_param),
              pipe.stats ? KernelArg::Workspace(ArgType::kFloat, "stats", stats, kWrite)
                         : KernelArg::Null(ArgType::kFloat, "stats", kWrite),
              pipe.moments_mean ? KernelArg::Output()
                                : KernelArg::Null(ArgType::kTensorDType, "y", kWrite)};
  fin.restrict_pointers = true;
  plan.kernels.push_back(fin);

  if (pipe.apply) {
    KernelLaunch apply;
    apply.symbol = "fj_gn_apply";
    apply.body = pre_in_workspace ? "fj::gn_apply_out_body<Cfg>" : "fj::gn_apply_body<Cfg>";
    apply.purpose = pre_in_workspace ? "normalize the pre-norm values into y, affine, post-ops"
                                     : "normalize y in place, affine, post-ops";
    const int64_t per_block = s % 4 == 0 ? 128 * 4 * 4 : 128 * 4;  // gn_apply.cuh GnApply
    apply.grid = {static_cast<unsigned>(CeilDiv(s, per_block)), static_cast<unsigned>(n * c), 1};
    apply.block = {128, 1, 1};
    apply.args = {KernelArg::Param("gamma", info.gamma_param),
                  KernelArg::Param("beta", info.beta_param),
                  KernelArg::Workspace(ArgType::kFloat, "stats", stats, kRead)};
    if (pre_in_workspace)
      apply.args.push_back(KernelArg::Workspace(ArgType::kFloat, "pre", z, kRead));
    apply.args.push_back(KernelArg::Output());
    apply.restrict_pointers = true;
  plan.kernels.push_back(apply);
  }
  if (pipe.row_mean) {
    const bool all = info.mean == MeanMode::kAll;
    KernelLaunch rm;
    rm.symbol = "fj_tc_row_mean";
    rm.body = "fj::tc_row_mean_body<Cfg>";
    rm.purpose = "mean over space of post(group_norm(pre-norm values)) per (n, c), in double";
    rm.grid = {static_cast<unsigned>(n * c), 1, 1};
    rm.block = {256, 1, 1};
    rm.args = {KernelArg::Workspace(ArgType::kFloat, "z", z, kRead),
               KernelArg::Param("gamma", info.gamma_param),
               KernelArg::Param("beta", info.beta_param),
               KernelArg::Workspace(ArgType::kFloat, "stats", stats, kRead),
               all ? KernelArg::Null(ArgType::kTensorDType, "y", kWrite)
                   : KernelArg::Output(),
               all ? KernelArg::Workspace(ArgType::kDouble, "rows", rows, kWrite)
                   : KernelArg::Null(ArgType::kDouble, "rows", kWrite)};
    rm.restrict_pointers = true;
  plan.kernels.push_back(rm);
    if (all) {
      KernelLaunch ma;
      ma.symbol = "fj_tc_mean_all";
      ma.body = "fj::tc_mean_all_body<Cfg>";
      ma.purpose = "y[n] = the channel means summed in a fixed order / C";
      ma.grid = {static_cast<unsigned>(n), 1, 1};
      ma.block = {256, 1, 1};
      ma.args = {KernelArg::Workspace(ArgType::kDouble, "rows", rows, kRead),
                 KernelArg::Output()};
      ma.restrict_pointers = true;
  plan.kernels.push_back(ma);
    }
  }
  return plan;
}

}  // namespace

void AddTcConvStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(std::make_unique<TcConvStrategy>());
}

}  // namespace fusejit::codegen
