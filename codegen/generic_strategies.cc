// The generic strategies: correct for every valid chain, built on templates/generic.cuh. Each
// output point evaluates the producer directly; group_norm statistics are reduced in a fixed
// order through a small workspace of per-block partials (no float atomics). Launch shapes (block
// size, grid, reduction chunks) are tunable: GenericTune.
#include <algorithm>
#include <cmath>
#include <span>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/generic_strategies.h"

#include "codegen/strategy_util.h"

namespace fusejit::codegen {
namespace {

using Kind = KernelArg::Kind;

// x, y and the parameters are of the chain's dtype (the kernels convert at loads and stores).
// The (mean, rstd) statistics as a kernel reads them: double2 in f64 chains.
KernelArg Stats(const ChainInfo& info, size_t offset) {
  return KernelArg::Workspace(info.dtype == DType::kF64 ? ArgType::kDouble2 : ArgType::kFloat2,
                              "stats", offset, kRead);
}

// Blocks of a grid dimension: CeilDiv (strategy_util.h) as a launch's unsigned.
unsigned GridBlocks(int64_t a, int64_t b) { return static_cast<unsigned>(CeilDiv(a, b)); }

// The launch shape of the generic kernels. Each strategy tunes the members it uses (its
// TuneField list); the others keep their defaults and are not emitted.
struct GenericTune {
  int64_t block = 256;         // threads per block of every kernel
  int64_t grid_per_sm = 16;    // grid-stride kernels: at most this many blocks per SM
  int64_t chunks = 1;          // blocks per (sample, group) of the statistics pass
  int64_t mean_chunks = 1;     // blocks per mean output plane of the mean pass
};

constexpr TuneField<GenericTune> kBlockField = {"block", "kBlock", &GenericTune::block};
constexpr TuneField<GenericTune> kGridField = {"grid_per_sm", "kGridPerSM",
                                               &GenericTune::grid_per_sm};
constexpr TuneField<GenericTune> kChunksField = {"chunks", "kChunks", &GenericTune::chunks};
constexpr TuneField<GenericTune> kMeanChunksField = {"mean_chunks", "kMeanChunks",
                                                     &GenericTune::mean_chunks};

// Grid for a grid-stride loop over `elements`: enough blocks to fill the device a few times.
unsigned StrideGrid(int64_t elements, const PlanTarget& target, const GenericTune& t) {
  return std::max(1u, std::min<unsigned>(GridBlocks(elements, t.block),
                                         static_cast<unsigned>(target.sm_count * t.grid_per_sm)));
}

// Blocks per reduction segment: enough blocks in all to fill the device, each with at least a
// few elements per thread -- one where each element is a convolution's sum of at least 8
// products (`macs_per_point`): 4 would leave the device mostly idle when the output is small
// against its convolution ([8,24,26,18,29] k5 s2 -> 4 channels | mean: 32 blocks) -- and at
// most 65535 (grid.y).
int64_t ChunksFor(int64_t segments, int64_t segment_length, const PlanTarget& target, int64_t block,
                  double macs_per_point) {
  const int64_t want_blocks = static_cast<int64_t>(target.sm_count) * 8;
  const int64_t per_thread = macs_per_point >= 8 ? 1 : 4;
  int64_t chunks = (want_blocks + segments - 1) / segments;
  chunks = std::min<int64_t>(chunks, std::max<int64_t>(1, segment_length / (block * per_thread)));
  return std::clamp<int64_t>(chunks, 1, 65535);
}

// Segments of the statistics pass (sample, group) and of the mean pass (sample, channel), and
// their lengths.
struct Segments {
  int64_t stats = 0, stats_length = 0, mean = 0, mean_length = 0;
};
Segments SegmentsOf(const ChainInfo& info) {
  Segments s;
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  const int64_t groups = info.group_norm ? info.group_norm->groups : 1;
  s.stats = n * groups;
  s.stats_length = info.elements / s.stats;
  s.mean = n * c;
  s.mean_length = info.elements / s.mean;
  return s;
}

// Values around a heuristic count: fractions and multiples of it, within [1, 65535].
std::vector<int64_t> AroundCount(int64_t v) {
  std::vector<int64_t> out;
  for (int64_t x : {v / 4, v / 2, v * 2, v * 4}) out.push_back(std::clamp<int64_t>(x, 1, 65535));
  return out;
}

// stats_kernel + stats_finalize_kernel; returns the offset of the float2 (mean, rstd) stats.
size_t AddStatistics(const ChainInfo& info, const GenericTune& t, bool store, Plan* plan) {
  const int64_t chunks = t.chunks;
  const int64_t n = info.producer_shape[0], groups = info.group_norm->groups;
  // f64 chains reduce in double (fj::MomentsD, double2), the others in float.
  const bool f64 = info.dtype == DType::kF64;
  const size_t partials = plan->AddWorkspace(
      "group moments, per block (count, mean, M2) x N*groups*chunks",
      static_cast<size_t>(n * groups * chunks) * (f64 ? 24 : 12));
  const size_t stats = plan->AddWorkspace("group statistics (mean, rstd) x N*groups",
                                          static_cast<size_t>(n * groups) * (f64 ? 16 : 8));
  KernelLaunch k;
  k.symbol = "fj_stats";
  k.body = absl::StrCat("fj::stats_kernel<Cfg, ", store ? "true" : "false", ", ", chunks, ">");
  k.purpose = store ? "producer + pre-ops, store pre-norm values into y, per-block group moments"
                    : "recompute producer + pre-ops (nothing stored), per-block group moments";
  k.grid = {static_cast<unsigned>(n * groups), static_cast<unsigned>(chunks), 1};
  k.block = {static_cast<unsigned>(t.block), 1, 1};
  k.args = ProducerArgs(info);
  k.args.push_back(KernelArg::Output());
  k.args.push_back(KernelArg::Workspace(f64 ? ArgType::kMomentsD : ArgType::kMoments, "partials",
                                        partials, kWrite));
  plan->kernels.push_back(k);

  KernelLaunch f;
  f.symbol = "fj_stats_finalize";
  f.body = absl::StrCat("fj::stats_finalize_kernel<Cfg, ", chunks, ">");
  f.purpose = "merge each (sample, group)'s partials in chunk order -> mean, rstd";
  f.grid = {GridBlocks(n * groups, t.block), 1, 1};
  f.block = {static_cast<unsigned>(t.block), 1, 1};
  f.args = {KernelArg::Workspace(f64 ? ArgType::kMomentsD : ArgType::kMoments, "partials",
                                 partials, kRead),
            KernelArg::Workspace(f64 ? ArgType::kDouble2 : ArgType::kFloat2, "stats", stats,
                                 kWrite)};
  plan->kernels.push_back(f);
  return stats;
}

void AddMean(const ChainInfo& info, const GenericTune& t, bool norm, size_t stats_offset,
             Plan* plan) {
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  const int64_t chunks = t.mean_chunks;
  const size_t partials = plan->AddWorkspace("channel sums per block (double) x N*C*chunks",
                                             static_cast<size_t>(n * c * chunks) * 8);
  KernelLaunch k;
  k.symbol = "fj_mean_partial";
  k.body = absl::StrCat("fj::mean_partial_kernel<Cfg, ", norm ? "true" : "false", ", ", chunks,
                        ">");
  k.purpose = norm ? "recompute producer, ops and group_norm; per-block channel sums"
                   : "producer and ops; per-block channel sums";
  k.grid = {static_cast<unsigned>(n * c), static_cast<unsigned>(chunks), 1};
  k.block = {static_cast<unsigned>(t.block), 1, 1};
  k.args = ProducerArgs(info);
  k.args.push_back(KernelArg::Param("gamma", info.gamma_param));
  k.args.push_back(KernelArg::Param("beta", info.beta_param));
  k.args.push_back(Stats(info, stats_offset));
  k.args.push_back(KernelArg::Workspace(ArgType::kDouble, "partials", partials, kWrite));
  plan->kernels.push_back(k);

  const int64_t outputs = info.mean == MeanMode::kAll ? n : n * c;
  KernelLaunch f;
  f.symbol = "fj_mean_finalize";
  f.body = absl::StrCat("fj::mean_finalize_kernel<Cfg, ", chunks, ">");
  f.purpose = "sum partials in a fixed order (double) and divide -> y";
  f.grid = {GridBlocks(outputs, t.block), 1, 1};
  f.block = {static_cast<unsigned>(t.block), 1, 1};
  f.args = {KernelArg::Workspace(ArgType::kDouble, "partials", partials, kRead),
            KernelArg::Output()};
  plan->kernels.push_back(f);
}

Plan BasePlan(std::string name, std::string description) {
  Plan plan;
  plan.strategy = std::move(name);
  plan.description = std::move(description);
  plan.includes = {"generic.cuh"};
  return plan;
}

// Rough relative time of a generic plan: bytes moved per point at ~3 TB/s plus the producer's
// FLOPs at a generic-kernel rate, per point, times how often each happens. Each evaluation of a
// producer also costs its point's index arithmetic (64-bit divisions: ~3 ps a point at full
// issue); a conv3d strided along w gathers x at that stride (each 32-byte sector serves
// 8 / stride lanes), and a strided conv_transpose3d visits the taps of every output phase. Measured
// on the H200 (2026-11-29, bench/notes/session27_2026-11-29.txt): [32,48,38,14,39] 1x1 stride 2 ->
// 128 | group_norm: store-normalize 0.653 ms against tc-conv's 0.201 (modeled 183 against 198
// without these terms); [8,1,16,6,37] k2 -> 96 | mean: reduce-mean 0.049 against 0.029.
//
// Products beyond the first 128 of a point cost 3x (H200, 2026-11-29, session 28 run 2: generic
// plans of 256-8000 products a point ran 2.5-3.6x slower than this model without the term, e.g.
// [16,64,28,18,40] k2 stride 2 -> 20 | group_norm: store-normalize 0.421 ms modeled 0.116,
// [2,32,20,34,17] k2 -> 20 | relu: elementwise 0.050 modeled 0.015; below ~160 products the
// former rate held: [32,6,10,10,10] k3 s2 d2 -> 16 | group_norm 0.040 against tc-conv's 0.045).
constexpr double kCachedMacs = 128, kLoadBoundFactor = 3;
constexpr int64_t kFewInputChannels = 4;
double GenericCost(const ChainInfo& info, double bytes_per_point, double producer_passes) {
  double per_eval = 0;
  if (info.producer != nullptr) {
    const Dims3& s = info.producer->conv.stride;
    // conv3d: the sector use of x's gathers. conv_transpose3d: the loop visits every tap and
    // skips those of other output phases, so it costs macs_per_point (the phases' average)
    // times the phases ([16,128,22,16,27] k3 s2 -> 4 | group_norm: store-normalize 5.67 ms
    // against tc-conv's 0.80, modeled as 0.32 without this).
    const double loop = info.producer->kind == OpKind::kConv3d
                            ? static_cast<double>(std::min<int64_t>(s[2], 8))
                            : static_cast<double>(s[0] * s[1] * s[2]);
    // Past the first kCachedMacs products of a point the loop is bound by its two loads a
    // product (x gathered, the weight): kLoadBoundFactor times the rate of the first ones.
    // (Not with at most kFewInputChannels input channels, whose gathers stay in a few cache
    // lines: [1,3,37,32,7] k5 -> 20 | sigmoid, 375 products, elementwise 0.020 ms against
    // tc-conv's 0.025, session 28 run 3.)
    const double macs = info.macs_per_point;
    const double excess =
        info.input_channels <= kFewInputChannels ? 0.0 : std::max(0.0, macs - kCachedMacs);
    const double weighted = macs + (kLoadBoundFactor - 1.0) * excess;
    per_eval = 3.0 + 2.0 * weighted * loop / 15.0;
  }
  return static_cast<double>(info.elements) * (bytes_per_point / 3.0 + producer_passes * per_eval);
}

// How many times slower than GenericCost's rate a reduction pass evaluates the producer when its
// grid holds `threads` threads (at most one per point): below ~1024 threads an SM the SMs idle
// or cannot hide the gathers' latency. Measured on the H200 (2026-11-29,
// bench/random_chain_speed.py): reduce-mean with a k5 convolution ran 0.4-1.0 TFLOP/s on 8 K-49 K
// threads, against ~6 on a full grid. 1 without a producer (the pass is bound by its bytes).
double PassSlowdown(const ChainInfo& info, const PlanTarget& target, int64_t threads) {
  if (info.macs_per_point <= 0) return 1.0;
  const double full = static_cast<double>(target.sm_count) * 1024.0;
  const double have = static_cast<double>(std::min<int64_t>(threads, info.elements));
  return std::max(1.0, full / std::max(1.0, have));
}

// The generic strategies' tuning: each tunes a subset of GenericTune (Fields()) and builds its
// plan from a validated GenericTune (BuildTuned()).
class GenericStrategy : public Strategy {
 public:
  // Every generic kernel converts x, the parameters and y at its loads and stores
  // (templates/generic.cuh), except store-normalize's, which keeps pre-norm values in y.
  // f64 chains compute in double throughout (AccT, MomentsD).
  bool HandlesDType(DType) const override { return true; }
  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), Choose(in.info, in.target), Fields());
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    const GenericTune d = Choose(in.info, in.target);
    std::vector<TuneParam> space;
    for (const TuneField<GenericTune>& f : Fields()) {
      if (f.member == &GenericTune::block) space.push_back({"block", {128, 256, 512}});
      if (f.member == &GenericTune::grid_per_sm) space.push_back({"grid_per_sm", {4, 8, 16, 32}});
      if (f.member == &GenericTune::chunks) space.push_back({"chunks", AroundCount(d.chunks)});
      if (f.member == &GenericTune::mean_chunks) {
        space.push_back({"mean_chunks", AroundCount(d.mean_chunks)});
      }
    }
    return space;
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    absl::StatusOr<GenericTune> t = Parse(info, in.target, config);
    if (!t.ok()) return t.status();
    auto invalid = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", config.ToString(), ": ", why));
    };
    if (t->block < 64 || t->block > 1024 || t->block % 32 != 0) {
      return invalid(absl::StrCat("block ", t->block, " is not a multiple of 32 in [64, 1024]"));
    }
    if (t->grid_per_sm < 1 || t->grid_per_sm > 64) {
      return invalid(absl::StrCat("grid_per_sm ", t->grid_per_sm, " is not in [1, 64]"));
    }
    // Each block of a reduction gets at least one element per thread.
    const Segments seg = SegmentsOf(info);
    for (auto [what, v, length] : {std::tuple{"chunks", t->chunks, seg.stats_length},
                                   std::tuple{"mean_chunks", t->mean_chunks, seg.mean_length}}) {
      const int64_t most = std::clamp<int64_t>(length / t->block, 1, 65535);
      if (v < 1 || v > most) {
        return invalid(absl::StrCat(what, " ", v, " is not in [1, ", most, "] (segments of ",
                                    length, " elements, ", t->block, " threads a block)"));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    const ChainInfo& info = in.info;
    const GenericTune t = *Parse(info, in.target, config);
    Plan plan = BuildTuned(info, in.target, t);
    plan.tunes.push_back(ToTuneStruct("GenericTune", t, Fields()));
    return plan;
  }

 protected:
  // The members of GenericTune this strategy uses, in config order.
  virtual std::span<const TuneField<GenericTune>> Fields() const = 0;
  // REQUIRES: t passed Validate().
  virtual Plan BuildTuned(const ChainInfo& info, const PlanTarget& target,
                          const GenericTune& t) const = 0;

  // The producer-evaluation passes of the default configuration's statistics pass (group_norm)
  // and mean pass, each slowed by its grid's parallelism (PassSlowdown).
  static double StatsPasses(const PlanInput& in) {
    const GenericTune t = Choose(in.info, in.target);
    const Segments seg = SegmentsOf(in.info);
    return PassSlowdown(in.info, in.target, seg.stats * t.chunks * t.block);
  }
  static double MeanPasses(const PlanInput& in) {
    const GenericTune t = Choose(in.info, in.target);
    const Segments seg = SegmentsOf(in.info);
    return PassSlowdown(in.info, in.target, seg.mean * t.mean_chunks * t.block);
  }

 private:
  // The heuristic: 256 threads, 16 blocks an SM for grid-stride kernels, reductions split to
  // fill the device (ChunksFor).
  static GenericTune Choose(const ChainInfo& info, const PlanTarget& target) {
    GenericTune t;
    const Segments seg = SegmentsOf(info);
    t.chunks = ChunksFor(seg.stats, seg.stats_length, target, t.block, info.macs_per_point);
    t.mean_chunks = ChunksFor(seg.mean, seg.mean_length, target, t.block, info.macs_per_point);
    return t;
  }
  absl::StatusOr<GenericTune> Parse(const ChainInfo& info, const PlanTarget& target,
                                    const TuneConfig& config) const {
    if (config.strategy != name()) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", config.ToString(),
                                                     " is not for strategy ", std::string(name())));
    }
    return FromConfig(config, Fields(), Choose(info, target));
  }
};

constexpr TuneField<GenericTune> kElementwiseFields[] = {kBlockField, kGridField};
constexpr TuneField<GenericTune> kReduceMeanFields[] = {kBlockField, kMeanChunksField};
constexpr TuneField<GenericTune> kNormalizeFields[] = {kBlockField, kGridField, kChunksField};
constexpr TuneField<GenericTune> kRecomputeMeanFields[] = {kBlockField, kChunksField,
                                                           kMeanChunksField};

class ElementwiseStrategy : public GenericStrategy {
 public:
  std::string_view name() const override { return "elementwise"; }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    return !info.group_norm && info.mean == MeanMode::kNone;
  }
  // Its per-point convolution gathers the inputs from cache at about half the rate GenericCost
  // models, so the producer counts twice. Measured on the H200 (2026-11-28, ms, elementwise
  // against tc-conv, TF32 / fp32-accurate): [16,20,16,32,32] 1x1 -> 36 channels 0.080 / 0.079
  // against 0.051 / 0.076; [16,8,16,32,32] 1x1 -> 64: 0.063 against 0.055 / 0.058; and where
  // elementwise stays: [8,40,12,12,12] 1x1 -> 40: 0.013 against 0.015 / 0.016. f32 chains only:
  // that last chain in bf16 ran 0.0158 ms elementwise against tc-conv's 0.0137 on the CLI, but
  // 0.024 through the PyTorch drop-in with tc-conv's two kernels against 0.015 with one.
  // (Fitted with the producer counted twice and no per-point term; the per-point term of
  // GenericCost now stands for most of the second count: the choices above are unchanged.)
  double Cost(const PlanInput& in) const override { return GenericCost(in.info, 4, 1); }

 protected:
  std::span<const TuneField<GenericTune>> Fields() const override { return kElementwiseFields; }
  Plan BuildTuned(const ChainInfo& info, const PlanTarget& target,
                  const GenericTune& t) const override {
    Plan plan = BasePlan("elementwise", "one kernel: producer and elementwise ops per output point");
    KernelLaunch k;
    k.symbol = "fj_elementwise";
    k.body = "fj::elementwise_kernel<Cfg>";
    k.purpose = "y = ops(producer(x)) per output point";
    k.grid = {StrideGrid(info.elements, target, t), 1, 1};
    k.block = {static_cast<unsigned>(t.block), 1, 1};
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Output());
    plan.kernels.push_back(k);
    return plan;
  }
};

class ReduceMeanStrategy : public GenericStrategy {
 public:
  std::string_view name() const override { return "reduce-mean"; }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    return !info.group_norm && info.mean != MeanMode::kNone;
  }
  // Without a producer x is read once (4 bytes a point).
  double Cost(const PlanInput& in) const override {
    return GenericCost(in.info, in.info.producer ? 0 : 4, MeanPasses(in));
  }

 protected:
  std::span<const TuneField<GenericTune>> Fields() const override { return kReduceMeanFields; }
  Plan BuildTuned(const ChainInfo& info, const PlanTarget&, const GenericTune& t) const override {
    Plan plan = BasePlan("reduce-mean",
                         "per-block channel sums of ops(producer(x)), then a fixed-order sum");
    AddMean(info, t, /*norm=*/false, 0, &plan);
    return plan;
  }
};

// group_norm without mean: statistics pass, then the normalize pass, which reads the stored
// pre-norm values (store) or recomputes them (recompute).
class NormalizeStrategy : public GenericStrategy {
 public:
  explicit NormalizeStrategy(bool store) : store_(store) {}
  // store-normalize keeps the pre-norm values in y: f32 only (a narrower y would round them).
  bool HandlesDType(DType dtype) const override {
    return store_ ? dtype == DType::kF32 : GenericStrategy::HandlesDType(dtype);
  }
  std::string_view name() const override {
    return store_ ? "store-normalize" : "recompute-normalize";
  }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    return info.group_norm && info.mean == MeanMode::kNone;
  }
  // Without a producer x itself is read: once more by store-normalize (16 bytes a point), twice
  // by recompute-normalize (12).
  double Cost(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const bool x_read = !info.producer;
    // The normalize pass runs on a full grid (recompute-normalize: a second evaluation at the
    // elementwise rate).
    return store_ ? GenericCost(info, x_read ? 16 : 12, StatsPasses(in))
                  : GenericCost(info, x_read ? 12 : 4, StatsPasses(in) + 1);
  }

 protected:
  std::span<const TuneField<GenericTune>> Fields() const override { return kNormalizeFields; }
  Plan BuildTuned(const ChainInfo& info, const PlanTarget& target,
                  const GenericTune& t) const override {
    Plan plan = BasePlan(
        std::string(name()),
        store_ ? "pass 1 stores the pre-norm values into y and reduces group moments; pass 2 "
                 "normalizes y in place (one producer evaluation, y read and written twice)"
               : "pass 1 recomputes the producer to reduce group moments without writing; pass 2 "
                 "recomputes it, normalizes and writes y once (cheap producers)");
    const size_t stats = AddStatistics(info, t, store_, &plan);
    KernelLaunch k;
    k.symbol = "fj_normalize";
    k.body = absl::StrCat("fj::normalize_kernel<Cfg, ", store_ ? "true" : "false", ">");
    k.purpose = store_ ? "y = post-ops(group_norm(y)) in place"
                       : "y = post-ops(group_norm(pre-ops(producer(x)))), recomputed";
    k.grid = {StrideGrid(info.elements, target, t), 1, 1};
    k.block = {static_cast<unsigned>(t.block), 1, 1};
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Param("gamma", info.gamma_param));
    k.args.push_back(KernelArg::Param("beta", info.beta_param));
    k.args.push_back(Stats(info, stats));
    k.args.push_back(KernelArg::Output());
    plan.kernels.push_back(k);
    return plan;
  }

 private:
  bool store_;
};

class RecomputeMeanStrategy : public GenericStrategy {
 public:
  std::string_view name() const override { return "recompute-mean"; }
  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    return info.group_norm && info.mean != MeanMode::kNone;
  }
  // Without a producer, x itself is read twice (4 bytes a point each; channel-moments-mean reads
  // it once).
  double Cost(const PlanInput& in) const override {
    return GenericCost(in.info, in.info.producer ? 0 : 8, StatsPasses(in) + MeanPasses(in));
  }

 protected:
  std::span<const TuneField<GenericTune>> Fields() const override { return kRecomputeMeanFields; }
  Plan BuildTuned(const ChainInfo& info, const PlanTarget&, const GenericTune& t) const override {
    Plan plan = BasePlan("recompute-mean",
                         "pass 1 reduces group moments; pass 2 recomputes producer, ops and "
                         "group_norm and reduces channel sums; nothing full-size is stored");
    const size_t stats = AddStatistics(info, t, /*store=*/false, &plan);
    AddMean(info, t, /*norm=*/true, stats, &plan);
    return plan;
  }
};

}  // namespace

void AddGenericStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(std::make_unique<ElementwiseStrategy>());
  out->push_back(std::make_unique<ReduceMeanStrategy>());
  out->push_back(std::make_unique<NormalizeStrategy>(/*store=*/true));
  out->push_back(std::make_unique<NormalizeStrategy>(/*store=*/false));
  out->push_back(std::make_unique<RecomputeMeanStrategy>());
}

}  // namespace fusejit::codegen
