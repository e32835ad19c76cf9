// templates/geometry.cuh: kernel geometry that both the host planner and the device templates
// need, written once. The host compiles this file as C++ (codegen/*_strategy.cc include it as
// "templates/geometry.cuh"); NVRTC compiles it as one of the embedded templates. So a plan's
// launch shape (dynamic shared memory, grid) and the shape a template is compiled with come from
// the same arithmetic and cannot drift apart.
//
// Contract: plain C++17, no CUDA keywords and no includes; every function is constexpr over
// integers and returns a struct of sizes. Arguments are the chain's and the tuning's numbers
// (Cfg:: and Tune:: fields on the device, ChainInfo and the tune struct on the host).
#ifndef FJ_TEMPLATES_GEOMETRY_CUH_
#define FJ_TEMPLATES_GEOMETRY_CUH_

namespace fj {
namespace geom {

constexpr long long CeilDiv(long long a, long long b) { return (a + b - 1) / b; }
constexpr long long RoundUp(long long a, long long b) { return CeilDiv(a, b) * b; }

// ---- igemm (templates/igemm_mma.cuh): the operand precisions (Tune::kPrec) -------------------
// What each means: igemm_mma.cuh's header. fj::kPrec* on the device, the planner's PrecisionOf.
enum IgemmPrec {
  kPrecTF32x1 = 0,
  kPrecF16x3 = 1,
  kPrecBF16x1 = 2,
  kPrecF16x1 = 3,
  kPrecF16x1Scaled = 4
};
// One 16-bit product per term, 64 channels per 128-byte block: x and w are values of the
// chain's 16-bit dtype, or an f32 chain's scaled into fp16 (kPrecF16x1Scaled).
constexpr bool IgemmPrecX1(int prec) {
  return prec == kPrecBF16x1 || prec == kPrecF16x1 || prec == kPrecF16x1Scaled;
}
// x and w scaled by powers of two from their largest magnitudes (the absmax pass), the result by
// 1/(sx*sw): the fp16 encodings of an f32 chain's values.
constexpr bool IgemmPrecScaled(int prec) { return prec == kPrecF16x3 || prec == kPrecF16x1Scaled; }

// ---- mma_conv_moments.cuh (strategy mma-moments) ----------------------------------------------
// Input planes of kSlots input depths as f16 hi and lo halves, channels padded to 4, each output
// row's window padded to m16 tiles; B fragments of every k16 slice; then floats.
struct MmaMoments {
  long long cinp;          // input channels padded to 4
  long long mt;            // m16 tiles per output row
  long long nt;            // n8 tiles (output channels / 8)
  long long ks;            // k16 steps per (kd, kh)
  long long kwr;           // kw columns read (>= KW)
  long long winp;          // input columns of one row window
  long long row_halfs;     // halves per input row
  long long plane_halfs;   // halves per input plane
  long long plane_bytes;   // bytes per plane, 16-byte aligned
  long long slots;         // input depths a block keeps (the kd span)
  long long groups4;       // packed K: groups of 4 channels of one tap
  long long ksp;           // packed K: k16 steps for the whole kernel
  long long slices;        // k16 slices of B
  long long b_bytes;       // B fragments
  long long floats;        // float scratch (slots, channels, per-warp moments, 32 spare)
  long long hi_offset;     // byte offset of the hi planes
  long long lo_offset;     // byte offset of the lo planes
  long long shared_bytes;  // dynamic shared memory of the kernel, exactly
};

constexpr MmaMoments MmaMomentsOf(long long cin, long long hin, long long c, long long w,
                                  long long kd, long long kh, long long kw, long long sw,
                                  long long dild, long long dilw, long long warps, bool pack) {
  MmaMoments g{};
  g.cinp = RoundUp(cin, 4);
  g.mt = CeilDiv(w, 16);
  g.nt = c / 8;
  g.ks = CeilDiv(kw * g.cinp, 16);
  g.kwr = (g.ks * 16 - 1) / g.cinp + 1;
  g.winp = (g.mt * 16 - 1) * sw + (g.kwr - 1) * dilw + 1;
  g.row_halfs = g.winp * g.cinp;
  g.plane_halfs = hin * g.row_halfs;
  g.plane_bytes = RoundUp(2 * g.plane_halfs, 16);
  g.slots = (kd - 1) * dild + 1;
  g.groups4 = kd * kh * kw * (g.cinp / 4);
  g.ksp = CeilDiv(g.groups4, 4);
  g.slices = pack ? g.ksp : kd * kh * g.ks;
  g.b_bytes = g.slices * g.nt * 32 * 16;
  g.floats = g.slots + c + warps * c * 3 + 32;
  g.hi_offset = RoundUp(g.b_bytes + 4 * g.floats, 16);
  g.lo_offset = g.hi_offset + g.slots * g.plane_bytes;
  g.shared_bytes = g.lo_offset + g.slots * g.plane_bytes;
  return g;
}

// ---- mma_convt.cuh (strategies mma-convt-*) ---------------------------------------------------
// conv_transpose3d by output phase: output o = S*q + r takes tap k where (r + P - k*dil) % S == 0,
// from input i = q + (r + P - k*dil) / S. One dimension's taps over all phases r.
constexpr bool ConvTTap(long long r, long long k, long long p, long long dil, long long s) {
  return ((r + p - k * dil) % s + s) % s == 0;
}
constexpr long long ConvTOff(long long r, long long k, long long p, long long dil, long long s) {
  return (r + p - k * dil) / s;  // exact where ConvTTap holds
}
struct ConvTSpan {
  long long min_off;   // the smallest input offset of any (phase, tap); 0 with no tap
  long long max_off;   // the largest
  long long max_taps;  // the most taps of one phase
};
constexpr ConvTSpan ConvTSpanOf(long long s, long long p, long long k, long long dil) {
  ConvTSpan sp{0, 0, 0};
  bool any = false;
  for (long long r = 0; r < s; ++r) {
    long long taps = 0;
    for (long long kk = 0; kk < k; ++kk) {
      if (!ConvTTap(r, kk, p, dil, s)) continue;
      const long long o = ConvTOff(r, kk, p, dil, s);
      sp.min_off = any && sp.min_off < o ? sp.min_off : o;
      sp.max_off = any && sp.max_off > o ? sp.max_off : o;
      any = true;
      ++taps;
    }
    sp.max_taps = sp.max_taps > taps ? sp.max_taps : taps;
  }
  return sp;
}
// Input planes (ring of `slots` input depths) as f16 hi and (`split`: f32 chains) lo halves,
// channels-last, channels padded to 4, each staged row the points iw = min_off_w .. + winp - 1
// (zeros outside x); B fragments of every (kd, kh, rw, k16 step); floats; then one row buffer per
// warp (c rows of `pitch` floats: a warp's output row (od, oh), all channels).
struct MmaConvT {
  long long cinp;          // input channels padded to 4
  long long cpad;          // output channels padded to 8
  long long nt;            // n8 tiles
  long long wq;            // q values of the widest w phase
  long long mt;            // m16 tiles per phase row
  long long ks;            // k16 steps per (kd, kh, rw): the phase's w taps x cinp, padded
  long long min_off_w;     // the staged row's first input column
  long long winp;          // staged points per row
  long long row_halfs;     // halves per staged row
  long long plane_bytes;   // bytes per staged plane, 16-byte aligned
  long long min_off_d;     // the ring's first input depth, relative to qd
  long long slots;         // input depths a block keeps
  long long slices;        // k16 slices of B: kd * kh * sw * ks
  long long b_bytes;       // B fragments
  long long floats;        // slots inverse scales, cpad bias, 2 cpad scale/shift, warps*cpad*3, 32
  long long hi_offset;     // byte offset of the hi planes
  long long lo_offset;     // byte offset of the lo planes
  long long pitch;         // floats per channel row of a row buffer (bank spread: pitch % 16 == 4)
  long long rows_offset;   // byte offset of the row buffers
  long long accumulators;  // floats a thread accumulates: sw * mt * nt * 4
  long long shared_bytes;  // dynamic shared memory of the kernel, exactly
};
constexpr MmaConvT MmaConvTOf(long long cin, long long hin, long long c, long long w, long long kd,
                              long long kh, long long kw, long long sd, long long sw, long long pd,
                              long long pw, long long dild, long long dilw, long long warps,
                              bool split) {
  MmaConvT g{};
  g.cinp = RoundUp(cin, 4);
  g.cpad = RoundUp(c, 8);
  g.nt = g.cpad / 8;
  g.wq = CeilDiv(w, sw);
  g.mt = CeilDiv(g.wq, 16);
  const ConvTSpan sw_span = ConvTSpanOf(sw, pw, kw, dilw);
  const ConvTSpan sd_span = ConvTSpanOf(sd, pd, kd, dild);
  g.ks = CeilDiv((sw_span.max_taps > 0 ? sw_span.max_taps : 1) * g.cinp, 16);
  g.min_off_w = sw_span.min_off;
  g.winp = g.mt * 16 + (sw_span.max_off - sw_span.min_off);
  g.row_halfs = g.winp * g.cinp;
  g.plane_bytes = RoundUp(2 * hin * g.row_halfs, 16);
  g.min_off_d = sd_span.min_off;
  g.slots = sd_span.max_off - sd_span.min_off + 1;
  g.slices = kd * kh * sw * g.ks;
  g.b_bytes = g.slices * g.nt * 32 * 16;
  g.floats = g.slots + 3 * g.cpad + warps * g.cpad * 3 + 32;
  g.hi_offset = RoundUp(g.b_bytes + 4 * g.floats, 16);
  g.lo_offset = g.hi_offset + g.slots * g.plane_bytes;
  g.pitch = RoundUp(w > 4 ? w - 4 : 0, 16) + 4;
  g.rows_offset = g.lo_offset + (split ? g.slots * g.plane_bytes : 0);
  g.accumulators = sw * g.mt * g.nt * 4;
  g.shared_bytes = g.rows_offset + warps * c * g.pitch * 4;
  return g;
}

// ---- igemm_mma.cuh / igemm_wgmma.cuh (strategies igemm-*) -------------------------------------
// The implicit GEMM: a CTA computes bm output points x bn channels (bm = 64 per warpgroup; bn =
// 128 or 64, the wgmma n). Its A operand is a halo of input rows (144 bytes per point),
// double-buffered; B is `stages` stages of bn x 128 bytes; the epilogue (which stores f32 from the
// registers) reuses the space for column sums, (bm/16 + 2) x bn doubles, or a 16-bit output
// tile, bn x (bm + 8) values.
// Operands (x channels-last, weights [tap][co][ci]) are stored in 128-byte channel blocks, one
// k-step of the GEMM each: 32 channels (TF32 values, or fp16 high/low pairs), or 64 channels when
// every value is one 16-bit operand (`packed16`: bf16/f16 chains); the last block is zero-padded.
constexpr int kIgemmTileN = 128;      // output channels per CTA: the widest tile (wgmma n)
constexpr int kIgemmTileNSmall = 64;  // the narrow tile (wgmma n = 64)
constexpr int kIgemmMaxSplit = 8;     // the reduction split at most 8 ways (tuning "split")
constexpr int kIgemmHaloPitch = 144;  // bytes per halo point
constexpr int kIgemmBRowBytes = 128;  // one output channel's weights of one k-step
constexpr int kIgemmPrepPoints = 32;  // prep: input points per block; 64 packed
constexpr int kIgemmPrepWThreads = 256;  // prep: weight chunks (8 lanes) per block

struct Igemm {
  long long s;                                   // output points per sample
  long long sin;                                 // input points per sample
  long long taps;                                // kd * kh * kw
  long long bm;                                  // output points per CTA
  long long bn;                                  // output channels per CTA
  long long tiles;                               // CTAs along the points of one sample
  long long halo_cols, rows_spanned, halo_rows;  // the A halo: columns, output rows, input rows
  long long halo_bytes;                          // one halo buffer, 1 KiB aligned
  long long b_stage_bytes;                       // one weight stage: bn rows of 128 bytes
  long long pipe_bytes;                          // two halos and the B stages
  long long epi_bytes;                           // the epilogue's column sums
  long long smem;                                // dynamic shared memory of the GEMM kernel
  long long cin_block;                           // input channels per 128-byte block (32, 64)
  long long cb;                                  // channel blocks per point (k-steps per tap)
  long long slice_channels;                      // channels per wgmma k-slice (8 TF32, else 16)
  long long slices;                              // k-slices per block (F16x3: per half)
  long long last_slices;                         // k-slices of the last block that run
  long long cin_live;                            // input channels whose products run
  long long row_bytes;                           // bytes per point of xa, per (tap, co) of wb
  long long xa_bytes_per_sample;                 // x channels-last, one sample
  long long wb_bytes;                            // the weights, all taps and padded channels
  long long prep_points;                         // prep: input points per block
  long long prep_cb_per_block;                   // prep: channel blocks per x block (1 or cb)
  long long prep_x_blocks_per_sample;            // prep grid: blocks converting x, per sample
  long long prep_w_blocks;                       // prep grid: blocks converting the weights
};

// Input channels per 128-byte operand block (one k-step): 64 one-16-bit-operand values
// (packed16) or 32 otherwise. Channels past cin are zero up to whole blocks.
constexpr long long IgemmCinBlock(bool packed16) { return packed16 ? 64 : 32; }
// Channels per k-slice of a block (one wgmma k): 8 TF32 values, else 16 (16-bit operands; F16x3
// has a slice of highs and one of lows). With the one-product precisions (IgemmPrecX1) the main
// loop runs only the slices of the last block that hold real channels: the others are zero
// padding, whose products would add exact zeros (so skipping them changes no bit of the result).
// Measured on the H200 (2026-11-29, bench/notes/session24_2026-11-29.txt): bf16 [16,32,32^3]
// conv3d(64,k3) + group_norm 0.440 -> 0.373 ms, [4,200,8^3] 0.044 -> 0.041, TF32 [8,48,16^3]
// 0.048 -> 0.044; but F16x3 [8,48,16^3] 0.077 -> 0.085, so F16x3 and TF32 run whole blocks.
constexpr long long IgemmSliceChannels(int prec) { return prec == kPrecTF32x1 ? 8 : 16; }
// The input channels whose products run: whole blocks, or with one product whole slices.
constexpr long long IgemmLiveChannels(long long cin, int prec) {
  return RoundUp(cin, IgemmPrecX1(prec) ? IgemmSliceChannels(prec) : IgemmCinBlock(false));
}

// The group_norm parts of the igemm store epilogue: a group of c / groups channels lies across
// the bn-channel tiles from (g * cg) / bn to (g * cg + cg - 1) / bn; each tile writes one moments
// part per group it holds. IgemmGroupParts is the most parts of any group (the partials' stride).
constexpr long long IgemmGroupFirstTile(long long g, long long cg, long long bn) {
  return g * cg / bn;
}
constexpr long long IgemmGroupPartsOf(long long g, long long cg, long long bn) {
  return (g * cg + cg - 1) / bn - IgemmGroupFirstTile(g, cg, bn) + 1;
}
constexpr long long IgemmGroupParts(long long c, long long groups, long long bn) {
  long long most = 1;
  for (long long g = 0; g < groups; ++g) {
    const long long p = IgemmGroupPartsOf(g, c / groups, bn);
    most = p > most ? p : most;
  }
  return most;
}

// (d, h, w): output extents; (din, hin, win): input extents; cin: input channels; c: output
// channels padded to whole bn-channel tiles; k*, dil*, sh, sw: kernel, dilation and stride
// (conv3d; 1 for conv_transpose3d); bm, bn, stages: the tuning; prec: the operand precision
// (IgemmPrec; IgemmPrecX1: 64 channels per block, one 16-bit operand per value, instead of 32).
constexpr Igemm IgemmOf(long long d, long long h, long long w, long long din, long long hin,
                        long long win, long long cin, long long c, long long kd, long long kh,
                        long long kw, long long dilh, long long dilw, long long sh, long long sw,
                        long long bm, long long bn, long long stages, int prec) {
  const bool packed16 = IgemmPrecX1(prec);
  Igemm g{};
  g.s = d * h * w;
  g.sin = din * hin * win;
  g.taps = kd * kh * kw;
  g.bm = bm;
  g.bn = bn;
  g.tiles = CeilDiv(g.s, g.bm);
  const long long span_h = (kh - 1) * dilh;
  const long long span_w = (kw - 1) * dilw;
  // A tile's output rows (at most rows_spanned over one or two planes) need, per plane, (rows -
  // 1) * sh + 1 + span_h input rows: at most rows_spanned * sh + 2 * span_h for both.
  g.halo_cols = (w - 1) * sw + 1 + span_w;
  g.rows_spanned = (g.bm - 1 + w - 1) / w + 1;
  g.halo_rows = g.rows_spanned * sh + 2 * span_h;
  g.halo_bytes = RoundUp(g.halo_rows * g.halo_cols * kIgemmHaloPitch, 1024);
  g.b_stage_bytes = bn * kIgemmBRowBytes;
  g.pipe_bytes = 2 * g.halo_bytes + stages * g.b_stage_bytes;
  // IgemmShape::kEpiBytes: per-warp column sums, or a 16-bit output tile.
  g.epi_bytes = (g.bm / 16 + 2) * bn * 8 > bn * (g.bm + 8) * 2 ? (g.bm / 16 + 2) * bn * 8
                                                               : bn * (g.bm + 8) * 2;
  g.smem = g.pipe_bytes > g.epi_bytes ? g.pipe_bytes : g.epi_bytes;
  g.cin_block = IgemmCinBlock(packed16);
  g.cb = CeilDiv(cin, g.cin_block);
  g.slice_channels = IgemmSliceChannels(prec);
  g.slices = g.cin_block / g.slice_channels;
  g.last_slices = packed16 ? CeilDiv(cin - (g.cb - 1) * g.cin_block, g.slice_channels) : g.slices;
  g.cin_live = IgemmLiveChannels(cin, prec);
  g.row_bytes = g.cb * 128;
  g.xa_bytes_per_sample = g.sin * g.row_bytes;
  g.wb_bytes = g.taps * c * g.row_bytes;
  g.prep_points = packed16 ? 2 * kIgemmPrepPoints : kIgemmPrepPoints;  // the same smem bytes
  // An x block converts prep_points points of every channel block, or of one where a sample
  // has fewer than 64 such point blocks (small grids: more, smaller blocks; S8, [4,256,8,8,8],
  // TF32 prep 0.0115 -> 0.0074 ms, while W3's 16K blocks ran slower split, H200 2026-11-28).
  g.prep_cb_per_block = CeilDiv(g.sin, g.prep_points) < 64 ? 1 : g.cb;
  g.prep_x_blocks_per_sample = CeilDiv(g.sin, g.prep_points) * (g.cb / g.prep_cb_per_block);
  // One prep thread per 8-channel chunk of a weight block (16 bytes packed, 32 otherwise).
  g.prep_w_blocks = CeilDiv(g.taps * c * g.cb * (g.cin_block / 8), kIgemmPrepWThreads);
  return g;
}

// ---- wgrad_wgmma.cuh (the weight gradient on wgmma) ---------------------------------------------
// One GEMM per tap: M = T's channels (a), N = S's channels (b), K = (sample, point) pairs of T's
// grid in k-steps of 64. Operands channels-last in 64-channel tiles of 256 bytes per point (64
// fp16 highs, 64 fp16 lows); a CTA (one warpgroup) computes 64 a x bn b of one tap over one chunk
// of K, `stages` stages of 64 K rows: A highs and lows, B highs and lows (bn/64 blocks each), 8 KiB
// per 64 channels (the highs alone with one product).
constexpr int kWgradKStep = 64;               // K rows per k-step
constexpr int kWgradOperandBytes = 64 * 128;  // 64 K rows x 64 fp16 values
constexpr int kWgradAbsmaxBlocks = 264;
constexpr int kWgradPrepThreads = 256;  // threads of a prep block (both preps assume it)
struct WgradWgmma {
  long long a_tiles, b_tiles;  // 64-channel tiles of T and of S (operand rows of 256 bytes)
  long long b_ctas;            // CTAs along b: ceil(b / bn)
  long long t_bytes, s_bytes;  // the channels-last operands
  long long stage_bytes;       // one pipeline stage
  long long smem;              // dynamic shared memory of the GEMM kernel (+1 KiB alignment)
};
// a, b: channels of T and S; t_points, s_points: points per sample of T's and S's grids;
// products 3 (highs and lows staged) or 1 (the highs alone: half the stage).
constexpr WgradWgmma WgradWgmmaOf(long long n, long long a, long long b, long long t_points,
                                  long long s_points, long long bn, long long stages,
                                  long long products = 3) {
  WgradWgmma g{};
  g.a_tiles = CeilDiv(a, 64);
  g.b_tiles = CeilDiv(b, 64);
  g.b_ctas = CeilDiv(b, bn);
  g.t_bytes = n * t_points * g.a_tiles * 256;
  g.s_bytes = n * s_points * g.b_tiles * 256;
  g.stage_bytes = (products == 3 ? 2 : 1) * kWgradOperandBytes * (1 + bn / 64);
  g.smem = stages * g.stage_bytes + 1024;
  return g;
}

// The tap-reuse variant (templates/wgrad_taps.cuh), for stride 1: both operands laid out on one
// extended grid E (per axis T's extent + (k-1)*dil; T's values at their own points, zeros
// elsewhere; S's value q at e = q + pad), so that every tap's S row is T's row plus a constant
// offset. Rows: per (sample, d) plane of E `pp` rows (h * ew + w, then zeros up to a multiple of
// 64), the planes of all samples in order, then `tail` zero rows; each operand stored per
// 64-channel tile, highs then lows (three products), [tile][lohi][rows][128 bytes]. K: per
// (sample, d < td) plane its first steps_per_plane * 64 rows, in k-steps of 64. A CTA stages a
// k-step of T once and a window of S rows that `taps` consecutive kw taps share (one warpgroup
// per tap).
struct WgradTaps {
  long long ed, eh, ew;         // E's extents
  long long pp;                 // rows per (sample, d) plane: eh * ew rounded up to 64
  long long rows;               // rows of either operand: n * ed * pp + tail
  long long zero_row;           // the first of 64 zero rows of T (past every plane)
  long long steps_per_plane;    // k-steps per (sample, d) plane: ceil(th * ew / 64)
  long long steps;              // n * td * steps_per_plane
  long long groups;             // tap groups per (kd, kh): ceil(kw / taps)
  long long window;             // S rows the taps of a CTA read: 64 + (taps-1) * dil_w
  long long window_rows;        // S rows a stage holds per block: window + 7, rounded up to 8
  long long a_tiles, b_tiles;   // 64-channel tiles of T and S
  long long b_ctas;             // CTAs along b: ceil(b / bn)
  long long t_bytes, s_bytes;   // the operands
  long long stage_bytes, smem;  // one pipeline stage; dynamic shared memory (+1 KiB)
};
constexpr WgradTaps WgradTapsOf(long long n, long long a, long long b, long long td, long long th,
                                long long tw, long long kd, long long kh, long long kw,
                                long long dild, long long dilh, long long dilw, long long bn,
                                long long stages, long long products, long long taps) {
  WgradTaps g{};
  g.ed = td + (kd - 1) * dild;
  g.eh = th + (kh - 1) * dilh;
  g.ew = tw + (kw - 1) * dilw;
  g.pp = RoundUp(g.eh * g.ew, kWgradKStep);
  g.steps_per_plane = CeilDiv(th * g.ew, kWgradKStep);
  g.steps = n * td * g.steps_per_plane;
  g.groups = CeilDiv(kw, taps);
  g.window = kWgradKStep + (taps - 1) * dilw;
  g.window_rows = RoundUp(g.window + 7, 8);
  // A window may start up to the largest tap offset plus a plane past the last k-step's rows.
  g.zero_row = n * g.ed * g.pp;
  g.rows = g.zero_row + kWgradKStep + g.pp + g.window_rows + (g.groups * taps) * dilw;
  g.a_tiles = CeilDiv(a, 64);
  g.b_tiles = CeilDiv(b, 64);
  g.b_ctas = CeilDiv(b, bn);
  const long long lohi = products == 3 ? 2 : 1;
  g.t_bytes = g.a_tiles * lohi * g.rows * 128;
  g.s_bytes = g.b_tiles * lohi * g.rows * 128;
  g.stage_bytes = lohi * (kWgradOperandBytes + (bn / 64) * g.window_rows * 128);
  g.smem = stages * g.stage_bytes + 1024;
  return g;
}

// The halo weight-gradient kernel (templates/wgrad_halo.cuh). A k-step is one tile of T's grid:
// rh rows of h x seg points of w of one (n, d) plane, its points in row-major order, padded to a
// multiple of 16. It stages that T tile and, per S channel its column tile touches, the S box every
// tap of the tile reads ("halo"): kd planes x hh rows x hw points.
struct WgradHalo {
  long long bk;             // k-step length: rh * seg rounded up to 16
  long long hb, wb;         // tiles of T's grid along h and w
  long long steps;          // n * td * hb * wb k-steps in all
  long long hh, hw, plane;  // halo rows, points per row, floats per S channel (kd * hh * hw)
  long long channels;       // S channels a column tile of bn columns touches, at most
  long long halo;           // channels * plane
  long long smem;           // dynamic shared memory: two stages of the T tile and the halo as
                            // copied, one split into (TF32 high, low) pairs, a k-offset table
};
// Per axis (d, h, w): t* T's grid; k* kernel size; s* stride; l* dilation. kv = kd * kh * kw;
// b: S's channels; bm x bn the block tile.
constexpr WgradHalo WgradHaloOf(long long n, long long td, long long th, long long tw, long long kd,
                                long long kh, long long kw, long long sh, long long sw,
                                long long lh, long long lw, long long b, long long rh,
                                long long seg, long long bm, long long bn) {
  WgradHalo g{};
  g.bk = RoundUp(rh * seg, 16);
  g.hb = CeilDiv(th, rh);
  g.wb = CeilDiv(tw, seg);
  g.steps = n * td * g.hb * g.wb;
  g.hh = (rh - 1) * sh + (kh - 1) * lh + 1;
  g.hw = (seg - 1) * sw + (kw - 1) * lw + 1;
  g.plane = kd * g.hh * g.hw;
  const long long kv = kd * kh * kw;
  const long long touched = (bn + kv - 2) / kv + 1;
  g.channels = touched < b ? touched : b;
  g.halo = g.channels * g.plane;
  g.smem = 2 * 4 * (g.bk * (bm + 8) + g.halo) + 8 * (g.bk * (bm + 4) + g.halo) + 4 * g.bk;
  return g;
}

// ---- few_in_backward.cuh (the backward plan's fused step for few input channels) ------------
// A block owns an x tile of xd x xh x xw points of one sample. Per axis, x point i's tap k reaches
// output o = a*i + b + k'*dil, where conv_transpose3d has a = stride, b = -padding, k' = k, and
// conv3d (stride 1 only) a = 1, b = padding - (kernel-1)*dil, k' = kernel-1-k. The tile's output
// region starts at a*i0 + b (its first point's tap k' = 0) and spans FewInBwdSpan points: every
// tap of the tile's points and the a points per x point the tile owns for the bias sum, plus
// `extra` (the last tile's outputs past the last tap: conv_transpose3d's output_padding beyond
// the padding), whichever is longer.
constexpr long long FewInBwdSpan(long long t, long long a, long long k, long long dil,
                                 long long extra) {
  const long long taps = (t - 1) * a + (k - 1) * dil + 1 + extra;
  return taps > t * a ? taps : t * a;
}
constexpr long long FewInBwdStep(bool transposed, long long s) { return transposed ? s : 1; }
constexpr long long FewInBwdStart(bool transposed, long long p, long long k, long long dil) {
  return transposed ? -p : p - (k - 1) * dil;
}
// Outputs past the last tap: conv_transpose3d output_padding - padding; conv3d padding -
// (kernel-1)*dil (0 where the plan takes it: it requires padding <= (kernel-1)*dil).
constexpr long long FewInBwdExtra(bool transposed, long long p, long long k, long long dil,
                                  long long op) {
  const long long e = transposed ? op - p : p - (k - 1) * dil;
  return e > 0 ? e : 0;
}
struct FewInBwd {
  long long ld, lh, lw, region;  // the output region per axis and its points
  long long tiles;               // x tiles per sample
  long long taps_per_chunk;      // taps whose cin x taps weight partials one reduce-scatter sums
  long long chunks;              // ceil(kv / taps_per_chunk)
  long long points_per_thread;
  // Dynamic shared memory, floats: the region (grad_u of one channel), the weights, the warps'
  // partials (two buffers of chunks x warps x 32), group terms (4 per group); doubles: the warps'
  // bias sums per channel.
  long long weights_offset, partials_offset, terms_offset, bias_offset, smem;
};
// transposed: conv_transpose3d (else conv3d); cin, c: channels; din, hin, win: x's grid; k*, s*,
// p*, l* (dilation), o* (output_padding) per axis; groups (0: none); xd x xh x xw the tile;
// threads per block.
constexpr FewInBwd FewInBwdOf(bool transposed, long long cin, long long c, long long din,
                              long long hin, long long win, long long kd, long long kh,
                              long long kw, long long sd, long long sh, long long sw, long long pd,
                              long long ph, long long pw, long long ldd, long long ldh,
                              long long ldw, long long od, long long oh, long long ow,
                              long long groups, long long xd, long long xh, long long xw,
                              long long threads) {
  FewInBwd g{};
  g.ld = FewInBwdSpan(xd, FewInBwdStep(transposed, sd), kd, ldd,
                      FewInBwdExtra(transposed, pd, kd, ldd, od));
  g.lh = FewInBwdSpan(xh, FewInBwdStep(transposed, sh), kh, ldh,
                      FewInBwdExtra(transposed, ph, kh, ldh, oh));
  g.lw = FewInBwdSpan(xw, FewInBwdStep(transposed, sw), kw, ldw,
                      FewInBwdExtra(transposed, pw, kw, ldw, ow));
  g.region = g.ld * g.lh * g.lw;
  g.tiles = CeilDiv(din, xd) * CeilDiv(hin, xh) * CeilDiv(win, xw);
  const long long kv = kd * kh * kw;
  g.taps_per_chunk = 32 / cin < kv ? 32 / cin : kv;
  g.chunks = g.taps_per_chunk > 0 ? CeilDiv(kv, g.taps_per_chunk) : 0;
  g.points_per_thread = CeilDiv(xd * xh * xw, threads);
  const long long warps = threads / 32;
  g.weights_offset = RoundUp(g.region, 4);
  g.partials_offset = g.weights_offset + RoundUp(cin * c * kv, 4);
  g.terms_offset = g.partials_offset + 2 * g.chunks * warps * 32;
  g.bias_offset = RoundUp(g.terms_offset + 4 * groups, 2);
  g.smem = 4 * g.bias_offset + 8 * c * warps;
  return g;
}

// wgrad_direct.cuh: a conv3d's weight gradient on FFMA, a thread per (ci, kd, kh, group of ct
// output channels) and copy. c channels, x rows of the stage (rows output rows, stride sh,
// dilation lh, kh taps), x columns of an output row (w points, stride sw, dilation lw, kw taps).
struct WgradDirect {
  long long groups;    // channel groups: ceil(c / ct)
  long long cpad;      // groups * ct: grad_u's staged channels (zeros past c)
  long long tasks;     // cin * kd * kh * groups
  long long threads;   // tasks * copies, in whole warps
  long long rows_in;   // x rows a stage reaches per (ci, kd)
  long long cols;      // x columns an output row reaches
  long long pitch;     // cols rounded up to odd: the tasks' rows fall in different banks
  long long x_offset;  // floats: x's rows after grad_u's in a stage, rows * w * cpad
  long long stage;     // floats of one stage buffer (grad_u's rows, then x's), 16-byte multiple
  long long smem;      // bytes: two stage buffers, or the copies' double sums after them
};
constexpr WgradDirect WgradDirectOf(long long cin, long long c, long long w, long long kd,
                                    long long kh, long long kw, long long sh, long long sw,
                                    long long lh, long long lw, long long ct, long long rows,
                                    long long copies) {
  WgradDirect g{};
  g.groups = CeilDiv(c, ct);
  g.cpad = g.groups * ct;
  g.tasks = cin * kd * kh * g.groups;
  g.threads = RoundUp(g.tasks * copies, 32);
  g.rows_in = (rows - 1) * sh + (kh - 1) * lh + 1;
  g.cols = (w - 1) * sw + (kw - 1) * lw + 1;
  g.pitch = g.cols % 2 == 1 ? g.cols : g.cols + 1;
  g.x_offset = rows * w * g.cpad;
  g.stage = RoundUp(g.x_offset + cin * kd * g.rows_in * g.pitch, 4);
  const long long sums = 8 * copies * g.tasks * ct * kw;
  g.smem = 8 * g.stage > sums ? 8 * g.stage : sums;
  return g;
}

}  // namespace geom
}  // namespace fj

#endif  // FJ_TEMPLATES_GEOMETRY_CUH_
