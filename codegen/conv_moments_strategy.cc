// conv-moments-mean: conv3d | ew* | group_norm | mean (seeds W2, W4).
// templates/direct_conv_moments.cuh + moments_mean.cuh: direct convolution, each thread a tile of
// outputs for all channels in registers, weights in shared memory; the mean of an affine
// group_norm output is gamma_c (m_c - mu_g) rstd_g + beta_c, so per-channel moments suffice and
// nothing full-size is stored. Channels may be split over the grid (csplit: each block holds one
// part's weights, in dynamic shared memory up to the architecture's opt-in limit). Launch shapes:
// heuristics measured on the H100 for the seeds, an issue/occupancy model elsewhere
// (DefaultConfig); tunable (TuneSpace, Validate).
#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"

namespace fusejit::codegen {
namespace {

// ---- conv-moments-mean ----------------------------------------------------------------------

struct ConvMomentsTune {
  int64_t threads = 128, min_blocks = 2, ph = 1, pw = 6, blocks_per_sample = 1, csplit = 1,
          ksplit = 1;
};

// One description of ConvMomentsTune: config text, constants in the source (its order is the
// order of direct_conv_moments.cuh's DirectConvTune).
constexpr TuneField<ConvMomentsTune> kConvMomentsFields[] = {
    {"threads", "kThreads", &ConvMomentsTune::threads},
    {"min_blocks", "kMinBlocksPerSM", &ConvMomentsTune::min_blocks},
    {"ph", "kPH", &ConvMomentsTune::ph},
    {"pw", "kPW", &ConvMomentsTune::pw},
    {"blocks_per_sample", "kBlocksPerSample", &ConvMomentsTune::blocks_per_sample},
    {"csplit", "kCSplit", &ConvMomentsTune::csplit},
    {"ksplit", "kKSplit", &ConvMomentsTune::ksplit},
};

// Chains this strategy takes: conv3d (with bias) | ew* | group_norm | mean, at most kMaxChannels
// output channels (registers hold a tile for C / csplit channels; moments_mean.cuh allows 256) and
// at most kMaxMacs multiply-adds per output point (the weights of a channel part must fit shared
// memory; Validate checks the exact bytes).
constexpr int64_t kMaxChannels = 64;
constexpr int64_t kMaxMacs = 4096;
// The chains of the original heuristic (ChooseConvMomentsTune, measured on the seeds): few
// channels and a cheap producer, weights within static shared memory.
bool SeedDomain(const ChainInfo& info) {
  return info.producer_shape[1] <= 32 && info.macs_per_point <= 256;
}

// Opt-in dynamic shared memory per block (direct_conv_moments.cuh's kSharedLimit) and per SM.
int64_t SharedLimit(const std::string& arch) {
  if (arch.rfind("sm_9", 0) == 0) return 227 * 1024;
  if (arch == "sm_80" || arch == "sm_87") return 163 * 1024;
  if (arch == "sm_86" || arch == "sm_89") return 99 * 1024;
  return 48 * 1024;
}
int64_t SharedPerSm(const std::string& arch) { return SharedLimit(arch) + 1024; }

ConvMomentsTune ChooseConvMomentsTune(const ChainInfo& info, const PlanTarget& target) {
  ConvMomentsTune t;
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  t.min_blocks = c <= 16 ? 3 : 2;
  t.pw = c <= 24 ? 6 : 4;
  t.pw = std::min<int64_t>(t.pw, info.producer_shape[4]);
  const int64_t tiles = info.producer_shape[2] * info.producer_shape[3] *
                        ((info.producer_shape[4] + t.pw - 1) / t.pw);
  const int64_t want = (static_cast<int64_t>(target.sm_count) * t.min_blocks + n / 2) / n;
  t.blocks_per_sample = std::clamp<int64_t>(want, 1, std::max<int64_t>(1, tiles / t.threads));
  return t;
}

// The compile-time shapes of direct_conv_moments.cuh (DirectConvGeom) for a tuning, computed the
// same way.
struct ConvMomentsGeometry {
  int64_t cs = 0;            // channels per block (C / csplit)
  int64_t wcp = 0;           // input-row floats per thread (kWcP)
  int64_t rows = 0;          // input rows per (ci, kd) of a tile (kR)
  int64_t tiles = 0;         // output tiles of kPH x kPW points per sample
  int64_t slots = 0;         // tiles a block works on at once (threads / ksplit)
  int64_t shared_bytes = 0;  // dynamic shared memory of conv_moments (kSharedBytes)
  int64_t accumulators = 0;  // floats per thread
};

ConvMomentsGeometry ConvMomentsGeom(const Chain& chain, const ChainInfo& info,
                                    const ConvMomentsTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t cs = info.producer_shape[1] / std::max<int64_t>(1, t.csplit);
  const int64_t slots = t.threads / std::max<int64_t>(1, t.ksplit);
  const int64_t csp = Round4(cs);
  const int64_t smem_w = chain.input[1] * conv.kernel[0] * conv.kernel[1] * conv.kernel[2] * csp + csp;
  const int64_t scratch = 2 * (t.threads / 32) * (2 * cs + 1);  // doubles
  const int64_t wc = (t.pw - 1) * conv.stride[2] + (conv.kernel[2] - 1) * conv.dilation[2] + 1;
  const int64_t wcp = Round4(wc);
  const int64_t xbuf = (2 * wcp / 4) % 2 == 1 ? 2 * wcp : 2 * wcp + 4;
  ConvMomentsGeometry g;
  g.cs = cs;
  g.wcp = wcp;
  g.rows = (t.ph - 1) * conv.stride[1] + (conv.kernel[1] - 1) * conv.dilation[1] + 1;
  g.tiles = info.producer_shape[2] * ((info.producer_shape[3] + t.ph - 1) / t.ph) *
            ((info.producer_shape[4] + t.pw - 1) / t.pw);
  g.slots = slots;
  g.accumulators = t.ph * t.pw * cs;
  g.shared_bytes = 4 * (smem_w + xbuf * t.threads + 2 * cs * slots +
                        (t.ksplit - 1) * g.accumulators * slots + scratch);
  return g;
}

// The checks direct_conv_moments.cuh and moments_mean.cuh static_assert, plus registers, shared
// memory per SM and grid shape.
absl::Status CheckConvMoments(const Chain& chain, const ChainInfo& info, const ConvMomentsTune& t,
                              const PlanTarget& target, const TuneConfig& c) {
  if (absl::Status s = CheckBlock(c, t.threads, t.min_blocks); !s.ok()) return s;
  const int64_t channels = info.producer_shape[1];
  if (channels > kMaxChannels) {
    return Invalid(c, absl::StrCat(channels, " channels: at most ", kMaxChannels));
  }
  if (t.csplit < 1 || channels % t.csplit != 0) {
    return Invalid(c, absl::StrCat("csplit ", t.csplit, " must divide the ", channels,
                                   " channels (channel parts over grid.z)"));
  }
  const int64_t ck = chain.input[1] * info.producer->conv.kernel[0];
  if (t.ksplit < 1 || t.threads % (32 * t.ksplit) != 0 || t.ksplit > ck) {
    return Invalid(c, absl::StrCat("ksplit ", t.ksplit, " must divide threads/32 (", t.threads / 32,
                                   ") and be at most Cin*KD (", ck, ")"));
  }
  if (t.ph < 1 || t.pw < 1 || t.ph > info.producer_shape[3] || t.pw > info.producer_shape[4]) {
    return Invalid(c, absl::StrCat("ph x pw = ", t.ph, " x ", t.pw, " must be within the ",
                                   info.producer_shape[3], " x ", info.producer_shape[4],
                                   " output plane"));
  }
  const ConvMomentsGeometry g = ConvMomentsGeom(chain, info, t);
  const int64_t limit = SharedLimit(target.arch);
  if (g.shared_bytes > limit) {
    return Invalid(c, absl::StrCat("needs ", g.shared_bytes, " bytes of shared memory per block, at "
                                   "most ", limit, " on ", target.arch));
  }
  if (t.min_blocks * (g.shared_bytes + 1024) > SharedPerSm(target.arch)) {
    return Invalid(c, absl::StrCat("min_blocks ", t.min_blocks, " blocks of ", g.shared_bytes,
                                   " bytes of shared memory do not fit an SM of ", target.arch));
  }
  if (g.accumulators + kRegisterOverhead > RegisterCap(t.threads, t.min_blocks)) {
    return Invalid(c, absl::StrCat(g.accumulators, " accumulators per thread do not fit the ",
                                   RegisterCap(t.threads, t.min_blocks),
                                   "-register cap of threads x min_blocks"));
  }
  const int64_t most = std::max<int64_t>(1, g.tiles / g.slots);
  if (t.blocks_per_sample < 1 || t.blocks_per_sample > most) {
    return Invalid(c, absl::StrCat("blocks_per_sample ", t.blocks_per_sample, " must be in [1, ",
                                   most, "] (", g.tiles, " tiles, ", g.slots, " per block round)"));
  }
  if (info.producer_shape[0] > 65535) {
    return Invalid(c, absl::StrCat("batch ", info.producer_shape[0], " over grid.y's 65535"));
  }
  return absl::OkStatus();
}

// Whether direct_conv_moments.cuh fetches input rows with 16-byte copies (its kVecRow).
bool RowsAligned(const Chain& chain, const ChainInfo& info, const ConvMomentsTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  return chain.input[4] % 4 == 0 && (t.pw * conv.stride[2]) % 4 == 0 && conv.padding[2] == 0;
}

// Registers a thread likely needs: accumulators, its input row, half a weight vector, the rest
// (rounded to the allocation unit of 8).
int64_t ModelRegisters(const ConvMomentsGeometry& g) {
  return (g.accumulators + g.wcp + g.cs / 2 + kRegisterOverhead + 7) / 8 * 8;
}

// Modeled time in microseconds of conv_moments with tuning `t` on the target, launch overhead
// not included (H100; constants fitted to ~1900 autotuner timings of W2, W4, W2-d, W2-f, W4-e,
// 2026-11-22: rms log error 0.17; among the measured tunings of 128 or 256 threads the model's
// pick is within 5% of the fastest for W2-d, W2-f and W4-e). Per tile each thread issues its
// FFMAs, 16-byte weight loads, per input row ~41 instructions plus the cp.async copies (each
// costing ~11 issue slots: the load/store path stalls the warp), the statistics, and with ksplit
// its share of the rows plus the exchange of sums (~53 slots per accumulator: two barriers a
// round, the other parts idle while part 0 merges). A scheduler
// issues up to 0.6 instructions a cycle per resident warp, at most 0.83 in all. The SM's L1
// takes about two wavefronts a cycle: per warp-wide copy one per input row the warp's tiles
// touch (more where a row's span crosses 128-byte lines; half for 16-byte copies), one per
// broadcast weight load, four per 16-byte row read. A wave takes the longer of the two. Blocks
// run in waves of the blocks an SM holds (registers, shared memory, threads); the busiest SM's
// time is the kernel's.
double ConvMomentsMicros(const Chain& chain, const ChainInfo& info, const ConvMomentsTune& t,
                         const PlanTarget& target) {
  constexpr double kCopyIssue = 11.3, kRowIssue = 41, kVecLines = 0.5, kWarpIssue = 0.6,
                   kSchedulerIssue = 0.83, kWavefrontCycles = 0.5, kExchangeIssue = 53;
  const ConvAttrs& conv = info.producer->conv;
  const ConvMomentsGeometry g = ConvMomentsGeom(chain, info, t);
  const double ck = static_cast<double>(chain.input[1] * conv.kernel[0]);
  const double khw = static_cast<double>(conv.kernel[1] * conv.kernel[2]);
  const double wc = static_cast<double>((t.pw - 1) * conv.stride[2] +
                                        (conv.kernel[2] - 1) * conv.dilation[2] + 1);
  const bool vec = RowsAligned(chain, info, t);
  const double ks = static_cast<double>(t.ksplit);
  const double copies = vec ? g.wcp / 4.0 : wc;  // cp.async per input row
  const double rows = ck * static_cast<double>(g.rows) / ks;  // per thread
  const double ffma = static_cast<double>(g.accumulators) * ck * khw / ks;
  const double lds = std::ceil(g.cs / 4.0) * static_cast<double>(t.ph) * ck * khw / ks;
  const double stats = static_cast<double>(g.cs) *
                       (static_cast<double>(t.ph * t.pw) * (2 + 10.0 * info.pre_ops.size()) + 12);
  const double exchange = t.ksplit > 1 ? kExchangeIssue * g.accumulators : 0;
  const double tile = ffma + lds + rows * (kCopyIssue * copies + g.wcp / 4.0 + kRowIssue) +
                      stats + exchange;
  const int64_t tw = (info.producer_shape[4] + t.pw - 1) / t.pw;  // tiles along w
  const double row_span = static_cast<double>(std::min<int64_t>(tw, 32) - 1) * t.pw *
                              conv.stride[2] * 4.0 + (vec ? 16.0 : 4.0);  // bytes, one copy
  const double lines = static_cast<double>(std::min<int64_t>(32, (32 + tw - 1) / tw + 1)) *
                       (1.0 + row_span / 128.0) * (vec ? kVecLines : 1.0);
  const double lsu_tile = rows * (copies * lines + g.wcp) + lds + exchange / 2;  // one warp

  const int64_t regs = std::min<int64_t>(256, ModelRegisters(g));
  const int64_t per_sm = std::max<int64_t>(
      1, std::min({65536 / (regs * t.threads), SharedPerSm(target.arch) / (g.shared_bytes + 1024),
                   2048 / t.threads, int64_t{32}}));
  const int64_t tiles_per_block = (g.tiles + t.blocks_per_sample - 1) / t.blocks_per_sample;
  const double rounds = static_cast<double>((tiles_per_block + g.slots - 1) / g.slots);
  const int64_t blocks = info.producer_shape[0] * t.blocks_per_sample * t.csplit;
  const int64_t sms = std::max(1, target.sm_count);
  const int64_t busiest = (blocks + sms - 1) / sms;  // blocks on the busiest SM
  auto wave_cycles = [&](int64_t resident) {
    const double warps = static_cast<double>(resident * t.threads) / 32.0;
    const double per_warp = std::min(kWarpIssue, kSchedulerIssue / std::max(1.0, warps / 4.0));
    return rounds * std::max(tile / per_warp, kWavefrontCycles * warps * lsu_tile);
  };
  double cycles = static_cast<double>(busiest / per_sm) * wave_cycles(per_sm);
  if (busiest % per_sm != 0) cycles += wave_cycles(busiest % per_sm);
  // Per wave: the block's weight copy (all cp.async in flight: a round trip plus 4 wavefronts
  // per 32 weights).
  const double copy = 1500.0 + static_cast<double>(g.cs) * ck * khw / 8.0;
  cycles += static_cast<double>((busiest + per_sm - 1) / per_sm) * copy;
  return cycles / 1755.0;  // sustained clock ~1.755 GHz
}

// The blocks an SM can hold with the registers (ModelRegisters) and shared memory of `t`: the
// min_blocks the model picks.
int64_t ModelMinBlocks(const Chain& chain, const ChainInfo& info, const ConvMomentsTune& t,
                       const PlanTarget& target) {
  const ConvMomentsGeometry g = ConvMomentsGeom(chain, info, t);
  const int64_t regs = ModelRegisters(g);
  return std::clamp<int64_t>(
      std::min({65536 / (std::max<int64_t>(regs, 32) * t.threads),
                SharedPerSm(target.arch) / (g.shared_bytes + 1024), 2048 / t.threads}),
      1, 8);
}

// Blocks-per-sample counts worth modeling: the ones that give each block k rounds of full
// slots (k = 1..16, rounded up), plus 1..8.
std::vector<int64_t> ModelBlockCounts(int64_t tiles, int64_t slots) {
  std::vector<int64_t> out;
  const int64_t most = std::max<int64_t>(1, tiles / slots);
  for (int64_t b = 1; b <= std::min<int64_t>(8, most); ++b) out.push_back(b);
  for (int64_t k = 1; k <= 16; ++k) {
    const int64_t b = (tiles + k * slots - 1) / (k * slots);
    if (b >= 1 && b <= most) out.push_back(b);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The tuning of least modeled time (ConvMomentsMicros) over threads (128, 256), K split, tile
// shape, channel split and blocks per sample, each with the min_blocks its registers and shared
// memory allow; the first found on ties. Returns false when none validates.
bool ModelConvMomentsTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                          ConvMomentsTune* best) {
  double best_us = 0;
  bool found = false;
  const int64_t c = info.producer_shape[1];
  auto consider = [&](ConvMomentsTune t) {
    if (t.ph > info.producer_shape[3]) return;
    const ConvMomentsGeometry g = ConvMomentsGeom(chain, info, t);
    // More than 255 registers a thread spill (the model charges no spills): R16's 224
    // accumulators (ph 2, pw 7, 16 channels) used 255 registers and spilled 504 bytes.
    if (ModelRegisters(g) > 255) return;
    t.min_blocks = ModelMinBlocks(chain, info, t, target);
    for (int64_t b : ModelBlockCounts(g.tiles, g.slots)) {
      t.blocks_per_sample = b;
      if (!CheckConvMoments(chain, info, t, target, TuneConfig{}).ok()) continue;
      const double us = ConvMomentsMicros(chain, info, t, target);
      if (!found || us < best_us) {
        found = true;
        best_us = us;
        *best = t;
      }
    }
  };
  for (int64_t csplit : {1, 2, 4, 8, 16}) {
    if (c % csplit != 0) continue;
    for (int64_t threads : {128, 256}) {  // 64-thread blocks measured slower on all five
      for (int64_t ksplit : {1, 2, 4}) {
        for (int64_t ph : {1, 2}) {
          for (int64_t pw = 1; pw <= std::min<int64_t>(8, info.producer_shape[4]); ++pw) {
            ConvMomentsTune t;
            t.threads = threads;
            t.ksplit = ksplit;
            t.ph = ph;
            t.pw = pw;
            t.csplit = csplit;
            consider(t);
          }
        }
      }
    }
  }
  return found;
}

// Seed domain: the heuristic tuning, or, where its block does not fit (static shared memory,
// registers), the first of a few smaller ones that does: fewer threads per block (with more
// blocks per SM) and narrower tiles (as measured on the seeds and the sweep, unchanged).
// Elsewhere, or when none of those fits: the modeled best (ModelConvMomentsTune). Returns the
// heuristic one when nothing fits (Applies() then says no).
ConvMomentsTune DefaultConvMomentsTune(const Chain& chain, const ChainInfo& info,
                                       const PlanTarget& target) {
  const ConvMomentsTune base = ChooseConvMomentsTune(info, target);
  if (SeedDomain(info)) {
    for (int64_t threads : {base.threads, base.threads / 2, base.threads / 4}) {
      for (int64_t pw : {base.pw, std::min<int64_t>(base.pw, 4), std::min<int64_t>(base.pw, 2)}) {
        ConvMomentsTune t = base;
        t.threads = threads;
        t.min_blocks = std::min<int64_t>(base.min_blocks * base.threads / threads, 8);
        t.pw = pw;
        const int64_t tiles = info.producer_shape[2] * info.producer_shape[3] *
                              ((info.producer_shape[4] + t.pw - 1) / t.pw);
        t.blocks_per_sample =
            std::clamp<int64_t>(base.blocks_per_sample, 1, std::max<int64_t>(1, tiles / t.threads));
        if (ConvMomentsGeom(chain, info, t).shared_bytes <= kStaticSharedLimit &&
            CheckConvMoments(chain, info, t, target, TuneConfig{}).ok()) {
          return t;
        }
      }
    }
  }
  ConvMomentsTune t;
  return ModelConvMomentsTune(chain, info, target, &t) ? t : base;
}

class ConvMomentsMeanStrategy : public Strategy {
 public:
  std::string_view name() const override { return "conv-moments-mean"; }
  bool Applies(const PlanInput& in) const override {
    if (!HasAmpereFeatures(in.target.arch)) return false;  // cp.async, mma.sync
    const ChainInfo& info = in.info;
    if (!info.producer || info.producer->kind != OpKind::kConv3d || !info.producer->conv.bias ||
        !info.group_norm || info.mean == MeanMode::kNone || !info.post_ops.empty() ||
        info.producer_shape[1] > kMaxChannels || info.macs_per_point > kMaxMacs) {
      return false;
    }
    const ConvMomentsTune t = DefaultConvMomentsTune(in.chain, info, in.target);
    return CheckConvMoments(in.chain, info, t, in.target, ToConfig(name(), t, Fields())).ok();
  }
  // ConvMomentsModeledCost, times kOffDomainFactor outside the seed domain (more input channels
  // or taps, more output channels): there the modeled time was 3.9-7.7x below the measured one
  // where tc-conv's was 1.6-2.9x below its own (H200, session 29: 9 chains of the random seeds,
  // each forced both ways in fp32, TF32 and bf16; 2x is the median gap), and TF32 and bf16 chains
  // took this FFMA plan where tc-conv ran 1.1-2.5x faster (R16 `x:bf16[32,16,36,36,36] |
  // conv3d(out=16,k=3,padding=1,dilation=2) | group_norm(groups=16) | mean(dims=[1,2,3,4])`:
  // 1.24 ms against tc-conv's 0.31).
  double Cost(const PlanInput& in) const override {
    // Not with few input channels (<= 4), where the model held and tc-conv pads the channels to
    // a 16-byte k-step: `x:bf16[32,3,16,64,64] | conv3d(out=32,k=5,stride=2) | group_norm |
    // mean` ran 0.169 ms through this f32 plan against tc-conv's 0.202 (H200, session 29 run 5).
    constexpr double kOffDomainFactor = 2.0;
    const bool modeled = SeedDomain(in.info) || in.info.input_channels <= 4;
    return ConvMomentsModeledCost(in) * (modeled ? 1.0 : kOffDomainFactor);
  }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), DefaultConvMomentsTune(in.chain, in.info, in.target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const ConvMomentsTune t = DefaultConvMomentsTune(in.chain, info, in.target);
    return {{"threads", {64, 128, 256}},
            {"min_blocks", {1, 2, 3, 4}},
            {"ph", {1, 2}},
            {"pw", {2, 3, 4, 5, 6, 8}},
            {"blocks_per_sample",
             BlocksPerSampleCandidates(t.blocks_per_sample, info.producer_shape[0], in.target)},
            {"csplit", {1, 2, 4, 8}},
            {"ksplit", {1, 2, 4}}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<ConvMomentsTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvMoments(in.chain, in.info, *t, in.target, config);
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const ConvMomentsTune t = *Parse(config);
    const ConvMomentsGeometry g = ConvMomentsGeom(in.chain, info, t);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "direct conv3d, a tile of outputs for all channels of a channel part per thread, that "
        "part's weights in shared memory; per-block per-channel moments of the pre-norm values; "
        "the mean of the affine group_norm output follows from them "
        "(gamma_c (m_c - mu_g) rstd_g + beta_c): nothing full-size stored";
    plan.includes = {"direct_conv_moments.cuh", "moments_mean.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvMomentsTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-block channel moments (count, mean, M2; double) x N*blocks_per_sample*C",
        static_cast<size_t>(n * t.blocks_per_sample * c) * 24);
    KernelLaunch k;
    k.symbol = "fj_conv_moments";
    k.body = "fj::conv_moments<Cfg, ConvMomentsTune>";
    k.purpose = "conv3d + pre-ops, per-block per-channel moments (no conv output stored)";
    k.grid = {static_cast<unsigned>(t.blocks_per_sample), static_cast<unsigned>(n),
              static_cast<unsigned>(t.csplit)};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k.shared_bytes = static_cast<unsigned>(g.shared_bytes);  // DirectConvGeom::kSharedBytes
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Workspace(ArgType::kMomentsD, "partials", partials, kWrite));
    plan.kernels.push_back(k);
    plan.kernels.push_back(
        MomentsMeanFinalizeLaunch(info, "ConvMomentsTune", ArgType::kMomentsD, partials));
    return plan;
  }

 private:
  static std::span<const TuneField<ConvMomentsTune>> Fields() { return kConvMomentsFields; }
  // Configurations written before ksplit existed (tuning databases, tests) name the first six
  // parameters only: ksplit 1, the kernel they were made for.
  absl::StatusOr<ConvMomentsTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a conv-moments-mean config");
    if (config.values.size() + 1 == Fields().size()) {
      absl::StatusOr<ConvMomentsTune> t = FromConfig(config, Fields().first(Fields().size() - 1));
      if (t.ok()) return t;
    }
    return FromConfig(config, Fields());
  }
};


}  // namespace

// Seed domain: FFMA work at a direct-conv rate (as before; always below the generic plans').
// Elsewhere: the modeled time of the default tuning in the generic strategies' units (their cost
// per modeled microsecond measured on the H100 for recompute-mean: ~3-4e-6 us per unit on the
// sweep's W2-d, W2-f, W4-e), so that a chain with too little parallelism for this plan can go to
// the generic one.
double ConvMomentsModeledCost(const PlanInput& in) {
  const ChainInfo& info = in.info;
  if (SeedDomain(info)) {
    return static_cast<double>(info.elements) * 2.0 * info.macs_per_point / 50.0;
  }
  return ConvMomentsMicros(in.chain, info, DefaultConvMomentsTune(in.chain, info, in.target),
                           in.target) /
         3.5e-6;
}

std::unique_ptr<Strategy> MakeConvMomentsMeanStrategy() { return std::make_unique<ConvMomentsMeanStrategy>(); }

}  // namespace fusejit::codegen
