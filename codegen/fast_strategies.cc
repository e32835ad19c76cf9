// Fast strategies for chains with a cheap producer (few input channels): direct convolution with
// each thread computing a tile of outputs for all channels in registers, weights in shared memory,
// nothing full-size stored.
//   conv-moments-mean          conv3d | ew* | group_norm | mean       (seeds W2, W4)
//       templates/direct_conv_moments.cuh + moments_mean.cuh: the mean of an affine group_norm
//       output is gamma_c (m_c - mu_g) rstd_g + beta_c, so per-channel moments suffice.
//   convt-recompute-normalize  conv_transpose3d | ew* | group_norm | ew*   (seed W1)
//       templates/convt_group_norm.cuh: statistics pass recomputing the transposed convolution by
//       output phase without writing, then a pass recomputing it, normalizing and writing once.
// Launch shapes are heuristics measured on the H100 (bench/explore/NOTES.md): DefaultConfig().
// Both strategies are tunable (TuneSpace, Validate); `fusejit autotune` measures the candidates.
#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"

namespace fusejit::codegen {
namespace {

using Kind = KernelArg::Kind;
constexpr int64_t kStaticSharedLimit = 48 * 1024;

int64_t Round4(int64_t v) { return (v + 3) / 4 * 4; }

KernelArg Arg(Kind kind, std::string type, std::string name, std::string param = "",
              size_t offset = 0) {
  return {kind, std::move(type), std::move(name), std::move(param), offset};
}


// Conditions both strategies share: a biased producer of the given kind, a group_norm, at most 32
// channels (per-lane channel registers), and a producer cheap enough to recompute per point.
bool CheapProducerWithNorm(const ChainInfo& info, OpKind kind) {
  return info.producer && info.producer->kind == kind && info.producer->conv.bias &&
         info.group_norm && info.producer_shape[1] <= 32 && info.macs_per_point <= 256;
}

// Register cap per thread under __launch_bounds__(threads, min_blocks) on sm_80/sm_90.
int64_t RegisterCap(int64_t threads, int64_t min_blocks) {
  return std::min<int64_t>(255, 65536 / (threads * std::max<int64_t>(1, min_blocks)));
}
// Registers a thread needs besides its accumulators (addresses, loop counters, temporaries): a
// rough allowance; a configuration over the cap would spill its accumulators.
constexpr int64_t kRegisterOverhead = 24;

// Checks shared by both strategies' launch shapes.
absl::Status CheckBlock(const TuneConfig& c, int64_t threads, int64_t min_blocks) {
  if (threads < 32 || threads > 1024 || threads % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tune config ", c.ToString(), ": threads ", threads, " is not a multiple of 32 in [32, 1024]"));
  }
  if (min_blocks < 1 || threads * min_blocks > 2048) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tune config ", c.ToString(), ": min_blocks ", min_blocks, " x ", threads,
        " threads does not fit an SM (at most 2048 threads, min_blocks >= 1)"));
  }
  return absl::OkStatus();
}

absl::Status Invalid(const TuneConfig& c, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("tune config ", c.ToString(), ": ", why));
}

// Candidate counts of blocks per sample around the heuristic's `b`: fractions and multiples of it,
// and the counts that fill the device 1..8 times over.
std::vector<int64_t> BlocksPerSampleCandidates(int64_t b, int64_t n, const PlanTarget& target) {
  std::vector<int64_t> out;
  for (int64_t v : {b / 4, b / 2, b * 2, b * 4}) out.push_back(std::max<int64_t>(1, v));
  for (int64_t m : {1, 2, 3, 4, 6, 8}) {
    out.push_back(std::max<int64_t>(1, (static_cast<int64_t>(target.sm_count) * m + n - 1) / n));
  }
  return out;
}

// ---- conv-moments-mean ----------------------------------------------------------------------

struct ConvMomentsTune {
  int64_t threads = 128, min_blocks = 2, ph = 1, pw = 6, blocks_per_sample = 1, csplit = 1;
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
};

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
  int64_t tiles = 0;         // output tiles of kPH x kPW points per sample
  int64_t slots = 0;         // tiles a block works on at once
  int64_t shared_bytes = 0;  // static shared memory of conv_moments
  int64_t accumulators = 0;  // floats per thread
};

ConvMomentsGeometry ConvMomentsGeom(const Chain& chain, const ChainInfo& info,
                                    const ConvMomentsTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t c = info.producer_shape[1], cs = c / t.csplit;
  const int64_t cp = t.csplit == 1 ? Round4(c) : c;
  const int64_t smem_w = chain.input[1] * conv.kernel[0] * conv.kernel[1] * conv.kernel[2] * cp + cp;
  const int64_t scratch = (t.threads / 32) * (2 * cs + 1);
  const int64_t wc = (t.pw - 1) * conv.stride[2] + (conv.kernel[2] - 1) * conv.dilation[2] + 1;
  const int64_t wcp = Round4(wc);
  const int64_t xbuf = (2 * wcp / 4) % 2 == 1 ? 2 * wcp : 2 * wcp + 4;
  ConvMomentsGeometry g;
  g.tiles = info.producer_shape[2] * ((info.producer_shape[3] + t.ph - 1) / t.ph) *
            ((info.producer_shape[4] + t.pw - 1) / t.pw);
  g.slots = t.threads / t.csplit;
  g.shared_bytes = 4 * (smem_w + scratch + (2 * cs + xbuf) * t.threads);
  g.accumulators = t.ph * t.pw * cs;
  return g;
}

// The checks direct_conv_moments.cuh static_asserts, plus registers and grid shape.
absl::Status CheckConvMoments(const Chain& chain, const ChainInfo& info, const ConvMomentsTune& t,
                              const TuneConfig& c) {
  if (absl::Status s = CheckBlock(c, t.threads, t.min_blocks); !s.ok()) return s;
  const int64_t channels = info.producer_shape[1];
  if (t.csplit < 1 || channels % t.csplit != 0 ||
      (t.csplit > 1 && (channels / t.csplit) % 4 != 0) || t.threads % (32 * t.csplit) != 0) {
    return Invalid(c, absl::StrCat("csplit ", t.csplit, " must split ", channels,
                                   " channels into parts of a multiple of 4 and divide threads/32"));
  }
  if (t.ph < 1 || t.pw < 1 || t.ph > info.producer_shape[3] || t.pw > info.producer_shape[4]) {
    return Invalid(c, absl::StrCat("ph x pw = ", t.ph, " x ", t.pw, " must be within the ",
                                   info.producer_shape[3], " x ", info.producer_shape[4],
                                   " output plane"));
  }
  const ConvMomentsGeometry g = ConvMomentsGeom(chain, info, t);
  if (g.shared_bytes > kStaticSharedLimit) {
    return Invalid(c, absl::StrCat("needs ", g.shared_bytes, " bytes of static shared memory, at "
                                   "most ", kStaticSharedLimit));
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
  return absl::OkStatus();
}

// The heuristic tuning, or, where its block does not fit (static shared memory, registers),
// the first of a few smaller ones that does: fewer threads per block (with more blocks per SM) and
// narrower tiles. Returns the heuristic one when none fits (Applies() then says no).
ConvMomentsTune DefaultConvMomentsTune(const Chain& chain, const ChainInfo& info,
                                       const PlanTarget& target) {
  const ConvMomentsTune base = ChooseConvMomentsTune(info, target);
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
      if (CheckConvMoments(chain, info, t, TuneConfig{}).ok()) return t;
    }
  }
  return base;
}

class ConvMomentsMeanStrategy : public Strategy {
 public:
  std::string_view name() const override { return "conv-moments-mean"; }
  bool Applies(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    if (!CheapProducerWithNorm(info, OpKind::kConv3d) || info.mean == MeanMode::kNone ||
        !info.post_ops.empty()) {
      return false;
    }
    const ConvMomentsTune t = DefaultConvMomentsTune(chain, info, target);
    return CheckConvMoments(chain, info, t, ToConfig(name(), t, Fields())).ok();
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * 2.0 * info.macs_per_point / 50.0;
  }
  TuneConfig DefaultConfig(const Chain& chain, const PlanTarget& target) const override {
    return ToConfig(name(), DefaultConvMomentsTune(chain, AnalyzeChain(chain), target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    const ConvMomentsTune t = DefaultConvMomentsTune(chain, info, target);
    return {{"threads", {64, 128, 256}},
            {"min_blocks", {1, 2, 3, 4}},
            {"ph", {1, 2}},
            {"pw", {2, 3, 4, 5, 6, 8}},
            {"blocks_per_sample",
             BlocksPerSampleCandidates(t.blocks_per_sample, info.producer_shape[0], target)},
            {"csplit", {1, 2, 4}}};
  }
  absl::Status Validate(const Chain& chain, const PlanTarget& target,
                        const TuneConfig& config) const override {
    absl::StatusOr<ConvMomentsTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvMoments(chain, AnalyzeChain(chain), *t, config);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    return MakeTunedPlan(chain, target, DefaultConfig(chain, target));
  }
  absl::StatusOr<Plan> MakeTunedPlan(const Chain& chain, const PlanTarget& target,
                                     const TuneConfig& config) const override {
    if (absl::Status s = Validate(chain, target, config); !s.ok()) return s;
    const ChainInfo info = AnalyzeChain(chain);
    const ConvMomentsTune t = *Parse(config);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "direct conv3d, a tile of outputs for all channels per thread, weights in shared memory; "
        "per-block per-channel moments of the pre-norm values; the mean of the affine group_norm "
        "output follows from them (gamma_c (m_c - mu_g) rstd_g + beta_c): nothing full-size stored";
    plan.includes = {"direct_conv_moments.cuh", "moments_mean.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvMomentsTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-block channel moments (count, mean, M2) x N*blocks_per_sample*C",
        static_cast<size_t>(n * t.blocks_per_sample * c) * 12);
    KernelLaunch k;
    k.symbol = "fj_conv_moments";
    k.body = "fj::conv_moments<Cfg, ConvMomentsTune>";
    k.purpose = "conv3d + pre-ops, per-block per-channel moments (no conv output stored)";
    k.grid = {static_cast<unsigned>(t.blocks_per_sample), static_cast<unsigned>(n), 1};
    k.block = {static_cast<unsigned>(t.threads), 1, 1};
    k.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k.args = {Arg(Kind::kInput, "const float*", "x"),
              Arg(Kind::kParam, "const float*", "weight", info.weight_param),
              Arg(Kind::kParam, "const float*", "bias", info.bias_param),
              Arg(Kind::kWorkspace, "fj::Moments*", "partials", "", partials)};
    plan.kernels.push_back(k);
    KernelLaunch f;
    f.symbol = "fj_moments_mean";
    f.body = "fj::moments_mean_finalize<Cfg, ConvMomentsTune>";
    f.purpose = "merge moments in a fixed order -> group mean/rstd -> mean of the group_norm output";
    f.grid = {static_cast<unsigned>(n), 1, 1};
    f.block = {32, 1, 1};
    f.args = {Arg(Kind::kWorkspace, "const fj::Moments*", "partials", "", partials),
              Arg(Kind::kParam, "const float*", "gamma", info.gamma_param),
              Arg(Kind::kParam, "const float*", "beta", info.beta_param),
              Arg(Kind::kOutput, "float*", "y")};
    plan.kernels.push_back(f);
    return plan;
  }

 private:
  static std::span<const TuneField<ConvMomentsTune>> Fields() { return kConvMomentsFields; }
  absl::StatusOr<ConvMomentsTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a conv-moments-mean config");
    return FromConfig(config, Fields());
  }
};

// ---- convt-recompute-normalize ----------------------------------------------------------------

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

// Warp units per sample (convt_group_norm.cuh ConvTGeom::kUnits): rows of one h phase, in groups
// of rows_per_unit.
int64_t ConvTUnits(const ChainInfo& info, int64_t rows_per_unit) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  return info.producer_shape[2] * conv.stride[1] * ((hq + rows_per_unit - 1) / rows_per_unit);
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
  const int64_t want = (static_cast<int64_t>(target.sm_count) * 2 * 2 + n / 2) / n;
  const int64_t most = std::max<int64_t>(1, ConvTUnits(info, 1) / (t.threads / 32));
  t.stat_blocks = t.write_blocks = std::clamp<int64_t>(want, 1, most);
  return t;
}

int64_t ConvTSharedBytes(const Chain& chain, const ChainInfo& info, const ConvTTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const int64_t cp = Round4(info.producer_shape[1]);
  const int64_t smem_w = conv.kernel[0] * conv.kernel[1] * chain.input[1] * conv.kernel[2] * cp + cp;
  return 4 * (smem_w + (t.threads / 32) * (2 * info.group_norm->groups + 1) + 2 * cp);
}

// The checks convt_group_norm.cuh makes, plus registers and grid shape.
absl::Status CheckConvT(const Chain& chain, const ChainInfo& info, const ConvTTune& t,
                        const TuneConfig& c) {
  if (absl::Status s = CheckBlock(c, t.threads, t.min_blocks); !s.ok()) return s;
  const ConvAttrs& conv = info.producer->conv;
  const int64_t hq = (info.producer_shape[3] + conv.stride[1] - 1) / conv.stride[1];
  if (t.rows_per_unit < 1 || t.rows_per_unit > hq) {
    return Invalid(c, absl::StrCat("rows_per_unit ", t.rows_per_unit, " must be in [1, ", hq,
                                   "] (rows per h phase)"));
  }
  const int64_t shared = ConvTSharedBytes(chain, info, t);
  if (shared > kStaticSharedLimit) {
    return Invalid(c, absl::StrCat("needs ", shared, " bytes of static shared memory, at most ",
                                   kStaticSharedLimit));
  }
  const int64_t acc = ConvTAccumulators(info, t);
  if (acc + kRegisterOverhead > RegisterCap(t.threads, t.min_blocks)) {
    return Invalid(c, absl::StrCat(acc, " accumulators per lane do not fit the ",
                                   RegisterCap(t.threads, t.min_blocks),
                                   "-register cap of threads x min_blocks"));
  }
  const int64_t most = std::max<int64_t>(1, ConvTUnits(info, t.rows_per_unit) / (t.threads / 32));
  for (auto [what, v] : {std::pair{"stat_blocks", t.stat_blocks}, {"write_blocks", t.write_blocks}}) {
    if (v < 1 || v > most) {
      return Invalid(c, absl::StrCat(what, " ", v, " must be in [1, ", most,
                                     "] (warp units per sample / warps per block)"));
    }
  }
  return absl::OkStatus();
}

class ConvTRecomputeStrategy : public Strategy {
 public:
  std::string_view name() const override { return "convt-recompute-normalize"; }
  bool Applies(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    if (!CheapProducerWithNorm(info, OpKind::kConvTranspose3d) ||
        info.mean != MeanMode::kNone || info.macs_per_point > 64) {
      return false;
    }
    const ConvTTune t = ChooseConvTTune(info, target);
    return CheckConvT(chain, info, t, ToConfig(name(), t, Fields())).ok();
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * (4.0 / 3.0 + 4.0 * info.macs_per_point / 50.0);
  }
  TuneConfig DefaultConfig(const Chain& chain, const PlanTarget& target) const override {
    return ToConfig(name(), ChooseConvTTune(AnalyzeChain(chain), target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    const ConvTTune t = ChooseConvTTune(info, target);
    const int64_t n = info.producer_shape[0];
    return {{"threads", {128, 256, 512}},
            {"min_blocks", {1, 2, 3, 4}},
            {"rows_per_unit", {1, 2, 4}},
            {"stat_blocks", BlocksPerSampleCandidates(t.stat_blocks, n, target)},
            {"write_blocks", BlocksPerSampleCandidates(t.write_blocks, n, target)},
            {"streaming_stores", {0, 1}},
            {"coalesce_stores", {0, 1}}};
  }
  absl::Status Validate(const Chain& chain, const PlanTarget& target,
                        const TuneConfig& config) const override {
    absl::StatusOr<ConvTTune> t = Parse(config);
    if (!t.ok()) return t.status();
    return CheckConvT(chain, AnalyzeChain(chain), *t, config);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    return MakeTunedPlan(chain, target, DefaultConfig(chain, target));
  }
  absl::StatusOr<Plan> MakeTunedPlan(const Chain& chain, const PlanTarget& target,
                                     const TuneConfig& config) const override {
    if (absl::Status s = Validate(chain, target, config); !s.ok()) return s;
    const ChainInfo info = AnalyzeChain(chain);
    const ConvTTune t = *Parse(config);
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
    const int64_t groups = info.group_norm->groups;
    Plan plan;
    plan.strategy = std::string(name());
    plan.description =
        "transposed conv split by output phase, weights in shared memory; pass 1 recomputes it for "
        "group moments without writing, pass 2 recomputes, normalizes and writes y once with "
        "coalesced stores";
    plan.includes = {"convt_group_norm.cuh"};
    plan.tunes.push_back(ToTuneStruct("ConvTTune", t, Fields()));
    const size_t partials = plan.AddWorkspace(
        "per-block group moments x N*stat_blocks*groups",
        static_cast<size_t>(n * t.stat_blocks * groups) * 12);
    const size_t scale_shift = plan.AddWorkspace("per-channel (scale, shift) x N*C",
                                                 static_cast<size_t>(n * c) * 8);
    const KernelArg x = Arg(Kind::kInput, "const float*", "x");
    const KernelArg w = Arg(Kind::kParam, "const float*", "weight", info.weight_param);
    const KernelArg b = Arg(Kind::kParam, "const float*", "bias", info.bias_param);
    KernelLaunch k1;
    k1.symbol = "fj_convt_moments";
    k1.body = "fj::convt_group_moments<Cfg, ConvTTune>";
    k1.purpose = "recompute conv_transpose3d + pre-ops by phase, per-block group moments";
    k1.grid = {static_cast<unsigned>(t.stat_blocks), static_cast<unsigned>(n), 1};
    k1.block = {static_cast<unsigned>(t.threads), 1, 1};
    k1.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k1.args = {x, w, b, Arg(Kind::kWorkspace, "fj::Moments*", "partials", "", partials)};
    plan.kernels.push_back(k1);
    KernelLaunch k2;
    k2.symbol = "fj_scale_shift";
    k2.body = "fj::group_norm_scale_shift<Cfg, ConvTTune>";
    k2.purpose = "merge partials in a fixed order -> per-channel scale and shift";
    k2.grid = {static_cast<unsigned>(n), 1, 1};
    k2.block = {32, 1, 1};
    k2.args = {Arg(Kind::kWorkspace, "const fj::Moments*", "partials", "", partials),
               Arg(Kind::kParam, "const float*", "gamma", info.gamma_param),
               Arg(Kind::kParam, "const float*", "beta", info.beta_param),
               Arg(Kind::kWorkspace, "float2*", "scale_shift", "", scale_shift)};
    plan.kernels.push_back(k2);
    KernelLaunch k3;
    k3.symbol = "fj_convt_write";
    k3.body = "fj::convt_norm_write<Cfg, ConvTTune>";
    k3.purpose = "recompute conv_transpose3d + pre-ops, normalize, post-ops, write y once";
    k3.grid = {static_cast<unsigned>(t.write_blocks), static_cast<unsigned>(n), 1};
    k3.block = {static_cast<unsigned>(t.threads), 1, 1};
    k3.min_blocks_per_sm = static_cast<unsigned>(t.min_blocks);
    k3.args = {x, w, b, Arg(Kind::kWorkspace, "const float2*", "scale_shift", "", scale_shift),
               Arg(Kind::kOutput, "float*", "y")};
    plan.kernels.push_back(k3);
    return plan;
  }

 private:
  static std::span<const TuneField<ConvTTune>> Fields() { return kConvTFields; }
  absl::StatusOr<ConvTTune> Parse(const TuneConfig& config) const {
    if (config.strategy != name()) return Invalid(config, "not a convt-recompute-normalize config");
    return FromConfig(config, Fields());
  }
};

}  // namespace

void AddFastStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(std::make_unique<ConvMomentsMeanStrategy>());
  out->push_back(std::make_unique<ConvTRecomputeStrategy>());
}

}  // namespace fusejit::codegen
