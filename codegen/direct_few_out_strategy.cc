// Strategy direct-few-out: a register-tiled direct convolution for producers with at most 8 (1x1x1: 32)
// output channels and chains with no group_norm or mean (templates/direct_few_out.cuh). Made for
// the data gradient of a convolution on few channels (the backward's step 3), which maps many
// channels onto x's few: the generic one-thread-per-output plan loads every input value once per
// output channel, and the tensor-core engine pads 3 channels to a 16-wide tile.
#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/fast_strategies.h"
#include "codegen/strategy_util.h"
#include "codegen/tune_config.h"

namespace fusejit::codegen {
namespace {

struct FewOutTune {
  int64_t tw = 4;        // outputs along w per thread
  int64_t th = 1;        // output rows along h per thread (more than 1: stride 1 along h)
  int64_t threads = 128;
};
constexpr TuneField<FewOutTune> kFields[] = {{"tw", "kTW", &FewOutTune::tw},
                                             {"th", "kTH", &FewOutTune::th},
                                             {"threads", "kThreads", &FewOutTune::threads}};

// Output channels: 8, or 32 for a 1x1x1 kernel (a pointwise convolution: the sums of fewer outputs
// a thread fit; R37 of the random chains, [4,40,37,37,37] k1 -> 20, ran one thread an output
// value at 0.62x of PyTorch's strict fp32, H200, session 30).
int64_t MaxChannels(const ConvAttrs& c) {
  return c.kernel == Dims3{1, 1, 1} ? 32 : 8;
}
constexpr int64_t kMaxWeights = 12 * 1024;  // floats in 48 KiB of static shared memory
constexpr int64_t kMaxSpan = 64;            // registers of one row span
constexpr int64_t kMaxAccumulators = 64;    // th * channels * tw registers of sums

// Whether several output rows per thread may share input rows: stride 1 along h.
bool RowsShareInput(const ChainInfo& info) {
  return info.producer->kind != OpKind::kConv3d || info.producer->conv.stride[1] == 1;
}

// The row span one thread loads for `tw` outputs (the template's kSpan).
int64_t Span(const ConvAttrs& c, bool conv, int64_t tw) {
  const int64_t step = conv ? c.stride[2] : 1;
  return (tw - 1) * step + (c.kernel[2] - 1) * c.dilation[2] + 1;
}

class DirectFewOutStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "direct-few-out"; }

  static FewOutTune DefaultTune(const ChainInfo& info) {
    FewOutTune t;
    const bool conv = info.producer->kind == OpKind::kConv3d;
    // Eight outputs along w a thread; two for a conv3d strided along h and w (measured with
    // `fusejit autotune` on the H100, 2026-11-26, ms for tw 8 / 2: W1's data gradient
    // [128,16,31,63,63] k3 s2 0.71 / 0.52; [32,16,32,64,64] k3 s2 0.337 / 0.163;
    // [64,8,32,32,32] k3 s2 0.102 / 0.056; strided along w only, [32,16,31,63,63] s[1,1,2]
    // 0.448 / 0.487; the stride-1 data gradients of W2 and W4 were fastest at 8).
    const ConvAttrs& a = info.producer->conv;
    const bool strided = conv && a.stride[1] >= 2 && a.stride[2] >= 2;
    t.tw = std::min<int64_t>(strided ? 2 : 8, info.producer_shape[4]);
    while (t.tw > 1 && (Span(a, conv, t.tw) > kMaxSpan ||
                        info.producer_shape[1] * t.tw > kMaxAccumulators)) {
      t.tw /= 2;
    }
    // Two rows a thread where they share input rows (each row span then serves both rows' kh
    // taps), the kernel is 4 or more rows tall and the sums fit: W2's data gradient
    // [1024,16,13,29,29] k4 took 2.47 ms at th 2 against 2.82 at th 1 (tw 4 / th 4 2.68, tw 4 / th
    // 2 2.79; 64 or 256 threads 2.70), H100, 2026-11-27; W4's [128,24,22,30,30] k3 0.483 against
    // 0.467 inside its backward.
    t.th = RowsShareInput(info) && a.kernel[1] >= 4 && info.producer_shape[3] >= 2 &&
                   2 * info.producer_shape[1] * t.tw <= kMaxAccumulators
               ? 2
               : 1;
    return t;
  }

  bool Applies(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    if (!info.producer || info.group_norm || info.mean != MeanMode::kNone) return false;
    const ConvAttrs& c = info.producer->conv;
    const bool conv = info.producer->kind == OpKind::kConv3d;
    if (!conv && c.stride != Dims3{1, 1, 1}) return false;
    const int64_t kv = c.kernel[0] * c.kernel[1] * c.kernel[2];
    return info.producer_shape[1] <= MaxChannels(c) &&
           info.producer_shape[1] * in.chain.input[1] * kv <= kMaxWeights &&
           Span(c, conv, 1) <= kMaxSpan;
  }

  // FMAs at ~30 TFLOP/s or the bytes (output written, input read once) at ~3 TB/s, whichever is
  // longer (ps); the FMAs slowed where the threads (each th x tw outputs of every channel) are
  // fewer than 256 an SM: H200, 2026-11-29 (session 28 run 2), [4,64,32,16,7] k3 padding 2 -> 4
  // channels ran 4.9 K threads (tw 8 over w = 9): 0.205 ms, modeled 0.010 without the term.
  double Cost(const PlanInput& in) const override {
    const ChainInfo& info = in.info;
    const double points = static_cast<double>(info.elements);
    const double bytes = 4.0 * (points + static_cast<double>(NumElements(in.chain.input)));
    const FewOutTune t = DefaultTune(info);
    const Shape& p = info.producer_shape;
    const double threads =
        static_cast<double>(p[0] * p[2] * CeilDiv(p[3], t.th) * CeilDiv(p[4], t.tw));
    const double slowdown =
        std::max(1.0, static_cast<double>(in.target.sm_count) * 256.0 / threads);
    return std::max(slowdown * points * 2.0 * info.macs_per_point / 30.0, bytes / 3.0);
  }

  TuneConfig DefaultConfig(const PlanInput& in) const override {
    return ToConfig(name(), DefaultTune(in.info), std::span<const TuneField<FewOutTune>>(kFields));
  }
  std::vector<TuneParam> TuneSpace(const PlanInput& in) const override {
    if (!RowsShareInput(in.info))
      return {{"tw", {1, 2, 4, 8}}, {"th", {1}}, {"threads", {64, 128, 256}}};
    return {{"tw", {1, 2, 4, 8}}, {"th", {1, 2, 4}}, {"threads", {64, 128, 256}}};
  }
  absl::Status Validate(const PlanInput& in, const TuneConfig& config) const override {
    return Parse(in.info, config).status();
  }
  absl::StatusOr<Plan> Build(const PlanInput& in, const TuneConfig& config) const override {
    absl::StatusOr<FewOutTune> t = Parse(in.info, config);
    if (!t.ok()) return t.status();
    const ChainInfo& info = in.info;
    const Shape& p = info.producer_shape;
    Plan plan;
    plan.strategy = std::string(name());
    plan.tune_config = config.ToString();
    plan.description =
        absl::StrCat("direct convolution onto ", p[1], " output channels: ", t->tw,
                     " outputs along w in ", t->th,
                     " row(s) and every channel per thread, weights in shared "
                     "memory, each input row span loaded once per (channel, kd, input row)");
    plan.includes = {"direct_few_out.cuh"};
    plan.tunes.push_back(ToTuneStruct("FewOutTune", *t, std::span<const TuneField<FewOutTune>>(kFields)));
    const int64_t items = p[0] * p[2] * ((p[3] + t->th - 1) / t->th) * ((p[4] + t->tw - 1) / t->tw);
    const int64_t blocks = std::clamp<int64_t>((items + t->threads - 1) / t->threads, 1,
                                               int64_t{in.target.sm_count} * 32);
    KernelLaunch k;
    k.symbol = "fj_few_out";
    k.body = "fj::few_out_kernel<Cfg, FewOutTune>";
    k.purpose = "y = ops(conv(x)) for every output channel, th x tw outputs a thread";
    k.grid = {static_cast<unsigned>(blocks), 1, 1};
    k.block = {static_cast<unsigned>(t->threads), 1, 1};
    k.args = ProducerArgs(info);
    k.args.push_back(KernelArg::Output());
    plan.kernels.push_back(k);
    return plan;
  }

 private:
  absl::StatusOr<FewOutTune> Parse(const ChainInfo& info, const TuneConfig& config) const {
    if (config.strategy != name()) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", config.ToString(),
                                                     " is not for strategy ", std::string(name())));
    }
    absl::StatusOr<FewOutTune> t =
        FromConfig<FewOutTune>(config, std::span<const TuneField<FewOutTune>>(kFields));
    if (!t.ok()) return t.status();
    const bool conv = info.producer->kind == OpKind::kConv3d;
    if (t->tw < 1 || t->tw > 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("tune config ", config.ToString(), ": tw ", t->tw, " is not in [1, 8]"));
    }
    if (Span(info.producer->conv, conv, t->tw) > kMaxSpan) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", config.ToString(), ": tw ",
                                                     t->tw, " needs a row span over ", kMaxSpan,
                                                     " registers"));
    }
    if (t->th != 1 && t->th != 2 && t->th != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("tune config ", config.ToString(), ": th ", t->th, " is not 1, 2 or 4"));
    }
    if (t->th > 1 && !RowsShareInput(info)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tune config ", config.ToString(), ": th ", t->th,
          " needs stride 1 along h (rows of a strided convolution share no input rows); use th=1"));
    }
    if (t->th * info.producer_shape[1] * t->tw > kMaxAccumulators) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tune config ", config.ToString(), ": th * tw * ", info.producer_shape[1], " channels = ",
          t->th * info.producer_shape[1] * t->tw, " sums exceed ", kMaxAccumulators, " registers"));
    }
    if (t->threads < 32 || t->threads > 1024 || t->threads % 32 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", config.ToString(),
                                                     ": threads ", t->threads,
                                                     " is not a multiple of 32 in [32, 1024]"));
    }
    return *t;
  }
};

}  // namespace

std::unique_ptr<Strategy> MakeDirectFewOutStrategy() {
  return std::make_unique<DirectFewOutStrategy>();
}

}  // namespace fusejit::codegen
