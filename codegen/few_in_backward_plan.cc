#include "codegen/few_in_backward_plan.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/strategy_util.h"
#include "codegen/weight_gradient_plan.h"
#include "fmt/format.h"
#include "fusejit/signature.h"

namespace fusejit::codegen {
namespace {

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

}  // namespace

// The x tile of least estimated time (FewInTime of its grid times FewInBlockCost): up to 8 points
// per thread, shared memory for two blocks per SM.
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

void AddFewInBackward(const Chain& chain, const ChainInfo& info, const FewInTile& t,
                      const std::string& u, bool u_rows_by_channel, KernelArg zpart_in,
                      KernelArg stats_in, std::optional<size_t> gpart, std::optional<size_t> bpart,
                      Plan& plan) {
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
                        {TuneInt("kXD", t.xd), TuneInt("kXH", t.xh), TuneInt("kXW", t.xw),
                         TuneInt("kThreads", kFewInThreads), TuneInt("kUnroll", unroll)}});
  if (u_rows_by_channel) plan.tunes.back().fields.push_back({"bool", "kURowsByChannel", "true"});
  plan.tunes.push_back({"WgTune", {TuneInt("kSplits", blocks)}});
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

}  // namespace fusejit::codegen
