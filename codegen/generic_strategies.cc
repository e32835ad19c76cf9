// The generic strategies: correct for every valid chain, built on templates/generic.cuh. Each
// output point evaluates the producer directly; group_norm statistics are reduced in a fixed
// order through a small workspace of per-block partials (no float atomics).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/generic_strategies.h"

namespace fusejit::codegen {
namespace {

constexpr unsigned kBlock = 256;

using Kind = KernelArg::Kind;

KernelArg In() { return {Kind::kInput, "const float*", "x", "", 0}; }
KernelArg Out() { return {Kind::kOutput, "float*", "y", "", 0}; }
KernelArg Param(std::string name, std::string param) {
  return {Kind::kParam, "const float*", std::move(name), std::move(param), 0};
}
KernelArg Ws(std::string type, std::string name, size_t offset) {
  return {Kind::kWorkspace, std::move(type), std::move(name), "", offset};
}

// x, weight, bias: the producer's inputs, first arguments of every generic kernel.
std::vector<KernelArg> ProducerArgs(const ChainInfo& info) {
  return {In(), Param("weight", info.weight_param), Param("bias", info.bias_param)};
}

unsigned CeilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Grid for a grid-stride loop over `elements`: enough blocks to fill the device a few times.
unsigned StrideGrid(int64_t elements, const PlanTarget& target) {
  return std::max(1u, std::min<unsigned>(CeilDiv(elements, kBlock),
                                         static_cast<unsigned>(target.sm_count) * 16));
}

// Blocks per reduction segment: enough blocks in all to fill the device, each with at least a
// few elements per thread, and at most 65535 (grid.y).
int ChunksFor(int64_t segments, int64_t segment_length, const PlanTarget& target) {
  const int64_t want_blocks = static_cast<int64_t>(target.sm_count) * 8;
  int64_t chunks = (want_blocks + segments - 1) / segments;
  chunks = std::min<int64_t>(chunks, std::max<int64_t>(1, segment_length / (kBlock * 4)));
  return static_cast<int>(std::clamp<int64_t>(chunks, 1, 65535));
}


// stats_kernel + stats_finalize_kernel; returns the offset of the float2 (mean, rstd) stats.
size_t AddStatistics(const ChainInfo& info, const PlanTarget& target, bool store, int chunks,
                     Plan* plan) {
  const int64_t n = info.producer_shape[0], groups = info.group_norm->groups;
  const size_t partials = plan->AddWorkspace(
      "group moments, per block (count, mean, M2) x N*groups*chunks",
      static_cast<size_t>(n * groups * chunks) * 12);
  const size_t stats = plan->AddWorkspace("group statistics (mean, rstd) x N*groups",
                                          static_cast<size_t>(n * groups) * 8);
  KernelLaunch k;
  k.symbol = "fj_stats";
  k.body = absl::StrCat("fj::stats_kernel<Cfg, ", store ? "true" : "false", ", ", chunks, ">");
  k.purpose = store ? "producer + pre-ops, store pre-norm values into y, per-block group moments"
                    : "recompute producer + pre-ops (nothing stored), per-block group moments";
  k.grid = {static_cast<unsigned>(n * groups), static_cast<unsigned>(chunks), 1};
  k.block = {kBlock, 1, 1};
  k.args = ProducerArgs(info);
  k.args.push_back(Out());
  k.args.push_back(Ws("fj::Moments*", "partials", partials));
  plan->kernels.push_back(k);

  KernelLaunch f;
  f.symbol = "fj_stats_finalize";
  f.body = absl::StrCat("fj::stats_finalize_kernel<Cfg, ", chunks, ">");
  f.purpose = "merge each (sample, group)'s partials in chunk order -> mean, rstd";
  f.grid = {CeilDiv(n * groups, kBlock), 1, 1};
  f.block = {kBlock, 1, 1};
  f.args = {Ws("const fj::Moments*", "partials", partials), Ws("float2*", "stats", stats)};
  plan->kernels.push_back(f);
  (void)target;
  return stats;
}

void AddMean(const ChainInfo& info, const PlanTarget& target, bool norm, size_t stats_offset,
             Plan* plan) {
  const int64_t n = info.producer_shape[0], c = info.producer_shape[1];
  const int64_t spatial = info.elements / (n * c);
  const int chunks = ChunksFor(n * c, spatial, target);
  const size_t partials = plan->AddWorkspace("channel sums per block (double) x N*C*chunks",
                                             static_cast<size_t>(n * c * chunks) * 8);
  KernelLaunch k;
  k.symbol = "fj_mean_partial";
  k.body = absl::StrCat("fj::mean_partial_kernel<Cfg, ", norm ? "true" : "false", ", ", chunks,
                        ">");
  k.purpose = norm ? "recompute producer, ops and group_norm; per-block channel sums"
                   : "producer and ops; per-block channel sums";
  k.grid = {static_cast<unsigned>(n * c), static_cast<unsigned>(chunks), 1};
  k.block = {kBlock, 1, 1};
  k.args = ProducerArgs(info);
  k.args.push_back(Param("gamma", info.gamma_param));
  k.args.push_back(Param("beta", info.beta_param));
  k.args.push_back(Ws("const float2*", "stats", stats_offset));
  k.args.push_back(Ws("double*", "partials", partials));
  plan->kernels.push_back(k);

  const int64_t outputs = info.mean == MeanMode::kAll ? n : n * c;
  KernelLaunch f;
  f.symbol = "fj_mean_finalize";
  f.body = absl::StrCat("fj::mean_finalize_kernel<Cfg, ", chunks, ">");
  f.purpose = "sum partials in a fixed order (double) and divide -> y";
  f.grid = {CeilDiv(outputs, kBlock), 1, 1};
  f.block = {kBlock, 1, 1};
  f.args = {Ws("const double*", "partials", partials), Out()};
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
// FLOPs at a generic-kernel rate, per point, times how often each happens.
double GenericCost(const ChainInfo& info, double bytes_per_point, double producer_passes) {
  return static_cast<double>(info.elements) *
         (bytes_per_point / 3.0 + producer_passes * 2.0 * info.macs_per_point / 15.0);
}

class ElementwiseStrategy : public Strategy {
 public:
  std::string_view name() const override { return "elementwise"; }
  bool Applies(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return !info.group_norm && info.mean == MeanMode::kNone;
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    return GenericCost(AnalyzeChain(chain), 4, 1);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    if (info.group_norm || info.mean != MeanMode::kNone) {
      return absl::FailedPreconditionError("elementwise: the chain has a group_norm or a mean");
    }
    Plan plan = BasePlan("elementwise", "one kernel: producer and elementwise ops per output point");
    KernelLaunch k;
    k.symbol = "fj_elementwise";
    k.body = "fj::elementwise_kernel<Cfg>";
    k.purpose = "y = ops(producer(x)) per output point";
    k.grid = {StrideGrid(info.elements, target), 1, 1};
    k.block = {kBlock, 1, 1};
    k.args = ProducerArgs(info);
    k.args.push_back(Out());
    plan.kernels.push_back(k);
    return plan;
  }
};

class ReduceMeanStrategy : public Strategy {
 public:
  std::string_view name() const override { return "reduce-mean"; }
  bool Applies(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return !info.group_norm && info.mean != MeanMode::kNone;
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    return GenericCost(AnalyzeChain(chain), 0, 1);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    Plan plan = BasePlan("reduce-mean",
                         "per-block channel sums of ops(producer(x)), then a fixed-order sum");
    AddMean(info, target, /*norm=*/false, 0, &plan);
    return plan;
  }
};

// group_norm without mean: statistics pass, then the normalize pass, which reads the stored
// pre-norm values (store) or recomputes them (recompute).
class NormalizeStrategy : public Strategy {
 public:
  explicit NormalizeStrategy(bool store) : store_(store) {}
  std::string_view name() const override {
    return store_ ? "store-normalize" : "recompute-normalize";
  }
  bool Applies(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return info.group_norm && info.mean == MeanMode::kNone;
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return store_ ? GenericCost(info, 12, 1) : GenericCost(info, 4, 2);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    Plan plan = BasePlan(
        std::string(name()),
        store_ ? "pass 1 stores the pre-norm values into y and reduces group moments; pass 2 "
                 "normalizes y in place (one producer evaluation, y read and written twice)"
               : "pass 1 recomputes the producer to reduce group moments without writing; pass 2 "
                 "recomputes it, normalizes and writes y once (cheap producers)");
    const int64_t n = info.producer_shape[0], groups = info.group_norm->groups;
    const int chunks = ChunksFor(n * groups, info.elements / (n * groups), target);
    const size_t stats = AddStatistics(info, target, store_, chunks, &plan);
    KernelLaunch k;
    k.symbol = "fj_normalize";
    k.body = absl::StrCat("fj::normalize_kernel<Cfg, ", store_ ? "true" : "false", ">");
    k.purpose = store_ ? "y = post-ops(group_norm(y)) in place"
                       : "y = post-ops(group_norm(pre-ops(producer(x)))), recomputed";
    k.grid = {StrideGrid(info.elements, target), 1, 1};
    k.block = {kBlock, 1, 1};
    k.args = ProducerArgs(info);
    k.args.push_back(Param("gamma", info.gamma_param));
    k.args.push_back(Param("beta", info.beta_param));
    k.args.push_back(Ws("const float2*", "stats", stats));
    k.args.push_back(Out());
    plan.kernels.push_back(k);
    return plan;
  }

 private:
  bool store_;
};

class RecomputeMeanStrategy : public Strategy {
 public:
  std::string_view name() const override { return "recompute-mean"; }
  bool Applies(const Chain& chain, const PlanTarget&) const override {
    const ChainInfo info = AnalyzeChain(chain);
    return info.group_norm && info.mean != MeanMode::kNone;
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    return GenericCost(AnalyzeChain(chain), 0, 2);
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    Plan plan = BasePlan("recompute-mean",
                         "pass 1 reduces group moments; pass 2 recomputes producer, ops and "
                         "group_norm and reduces channel sums; nothing full-size is stored");
    const int64_t n = info.producer_shape[0], groups = info.group_norm->groups;
    const int chunks = ChunksFor(n * groups, info.elements / (n * groups), target);
    const size_t stats = AddStatistics(info, target, /*store=*/false, chunks, &plan);
    AddMean(info, target, /*norm=*/true, stats, &plan);
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
