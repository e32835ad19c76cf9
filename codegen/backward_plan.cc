#include "codegen/backward_plan.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/convt_strategy.h"
#include "codegen/few_in_backward_plan.h"
#include "codegen/strategy_util.h"
#include "codegen/weight_gradient_plan.h"
#include "fmt/format.h"
#include "fusejit/signature.h"

namespace fusejit::codegen {
namespace {

constexpr int kThreads = 256;

}  // namespace

Chain ProducerChain(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  Chain c;
  c.input = chain.input;
  c.dtype = chain.dtype;
  c.ops.assign(chain.ops.begin(), chain.ops.begin() + info.producer_index + 1);
  return c;
}

Chain TailChain(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  Chain tail;
  tail.input = info.producer_shape;
  tail.dtype = chain.dtype;
  tail.ops.assign(chain.ops.begin() + info.producer_index + 1, chain.ops.end());
  return tail;
}

TensorSpec SavedProducerOutputSpec(const Chain& chain, ULayout layout) {
  const Shape& p = AnalyzeChain(chain).producer_shape;
  return {std::string(kProducerOutputName), TensorRole::kSaved, DType::kF32,
          layout == ULayout::kRowsByChannel ? Shape{p[0], p[2], p[3], p[1], p[4]} : p, 16};
}

TensorSpec SavedStatsSpec(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  return {std::string(kSavedStatsName),
          TensorRole::kSaved,
          DType::kF32,
          {chain.input[0], info.group_norm->groups, 2},
          16};
}

TensorSpec SavedMomentsSpec(const Chain& chain, int blocks) {
  const Shape& p = AnalyzeChain(chain).producer_shape;
  return {
      std::string(kSavedMomentsName), TensorRole::kSaved, DType::kF32, {p[0], blocks, p[1], 3}, 16};
}

std::vector<TensorSpec> SavedTensorSpecs(const Chain& chain, ULayout layout, bool stats,
                                         int moment_blocks) {
  std::vector<TensorSpec> specs = {SavedProducerOutputSpec(chain, layout)};
  if (stats) specs.push_back(SavedStatsSpec(chain));
  if (moment_blocks > 0) specs.push_back(SavedMomentsSpec(chain, moment_blocks));
  return specs;
}

bool BackwardReadsSavedMoments(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  return info.producer != nullptr && info.group_norm != nullptr && info.post_ops.empty() &&
         info.mean != MeanMode::kNone;
}

namespace {
// The forward's per-block channel moments: the finalize's "partials" argument.
bool IsMomentsPartials(const KernelArg& a) {
  return a.name == "partials" && a.kind == KernelArg::Kind::kWorkspace &&
         a.type == ArgType::kMoments;
}
}  // namespace

int SavableMomentBlocks(const Chain& chain, const Plan& plan) {
  if (!BackwardReadsSavedMoments(chain)) return 0;
  const KernelArg* partials = nullptr;
  for (const KernelLaunch& k : plan.kernels) {
    if (k.symbol != "fj_moments_mean") continue;
    for (const KernelArg& a : k.args) {
      if (IsMomentsPartials(a)) partials = &a;
    }
  }
  if (partials == nullptr) return 0;
  const Shape& p = AnalyzeChain(chain).producer_shape;
  const size_t per_block = static_cast<size_t>(p[0] * p[1]) * 12;  // sizeof(fj::Moments)
  for (const WorkspaceRegion& r : plan.workspace) {
    if (r.offset == partials->offset && r.bytes % per_block == 0 && r.bytes > 0) {
      return static_cast<int>(r.bytes / per_block);
    }
  }
  return 0;
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
bool CanSaveStats(const Chain& chain, const Plan& plan) {
  // A chain without a group_norm has no statistics, whatever its kernels' arguments are named.
  return AnalyzeChain(chain).group_norm != nullptr && HasOpenSaveSlot(plan, kSavedStatsName);
}

namespace {
// The tune struct whose kURowsByChannel the convt templates read (convt_group_norm.cuh).
constexpr std::string_view kURowsByChannelTune = "ConvTTune";
}  // namespace

bool CanSaveURowsByChannel(const Plan& plan) {
  if (!CanSaveProducerOutput(plan)) return false;
  for (const TuneStruct& t : plan.tunes) {
    if (t.name == kURowsByChannelTune) return true;
  }
  return false;
}

absl::Status SaveProducerOutput(const Chain& chain, Plan* plan, ULayout layout) {
  if (!CanSaveProducerOutput(*plan) || !plan->signature.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", plan->strategy, " plan cannot also write u, the convolution's output"));
  }
  if (layout == ULayout::kRowsByChannel) {
    if (!CanSaveURowsByChannel(*plan)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the ", plan->strategy, " plan cannot write u with the rows of its channels together"));
    }
    for (TuneStruct& t : plan->tunes) {
      if (t.name == kURowsByChannelTune) t.fields.push_back({"bool", "kURowsByChannel", "true"});
    }
  }
  const bool stats = CanSaveStats(chain, *plan);
  const int moment_blocks = SavableMomentBlocks(chain, *plan);
  for (KernelLaunch& k : plan->kernels) {
    for (KernelArg& a : k.args) {
      if (IsOpenSaveSlot(a, kProducerOutputName)) a.param = std::string(kProducerOutputName);
      if (stats && IsOpenSaveSlot(a, kSavedStatsName)) a.param = std::string(kSavedStatsName);
      if (moment_blocks > 0 && IsMomentsPartials(a)) {  // written there, not in the workspace
        a.kind = KernelArg::Kind::kTensor;
        a.param = std::string(kSavedMomentsName);
        a.offset = 0;
      }
    }
  }
  // x, the parameters, y, u, stats, the workspace (the composite training forward's without
  // stats).
  plan->signature = ForwardSignature(chain, plan->workspace_bytes);
  auto at = plan->signature.end();
  if (!plan->signature.empty() && plan->signature.back().name == kWorkspaceName) --at;
  const std::vector<TensorSpec> saved = SavedTensorSpecs(chain, layout, stats, moment_blocks);
  plan->signature.insert(at, saved.begin(), saved.end());
  const size_t bytes = SavedProducerOutputSpec(chain).bytes();
  absl::StrAppend(&plan->description, "; also writes u, the convolution's output (", bytes,
                  " bytes", layout == ULayout::kRowsByChannel ? ", laid out [N, D, H, C, W]" : "",
                  ")", stats ? ", and the group statistics" : "",
                  moment_blocks > 0 ? ", and its per-block channel moments" : "",
                  ", for the backward");
  return absl::OkStatus();
}

namespace {
// An argument where a kernel can read per-block maxima of |x| instead of scanning x, left null.
bool IsOpenInputMaximaSlot(const KernelArg& a) {
  return a.name == "xmax" && a.kind == KernelArg::Kind::kParam && a.param.empty() &&
         a.type == ArgType::kFloat && a.access == KernelArg::Access::kRead;
}
// The tune struct whose kXMaxima igemm_absmax_body reads (XMaximaOf).
constexpr std::string_view kInputMaximaTune = "IgemmFixed";
}  // namespace

bool CanReadInputMaxima(const Plan& plan) {
  bool tune = false;
  for (const TuneStruct& t : plan.tunes) tune |= t.name == kInputMaximaTune;
  for (const KernelLaunch& k : plan.kernels) {
    for (const KernelArg& a : k.args) {
      if (IsOpenInputMaximaSlot(a)) return tune;
    }
  }
  return false;
}

absl::Status ReadInputMaxima(const Chain& chain, Plan* plan, int64_t count) {
  if (!CanReadInputMaxima(*plan) || !plan->signature.empty() || count < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", plan->strategy, " plan cannot read per-block maxima of |x| (", count, ")"));
  }
  for (TuneStruct& t : plan->tunes) {
    if (t.name == kInputMaximaTune) t.fields.push_back(TuneInt("kXMaxima", count));
  }
  for (KernelLaunch& k : plan->kernels) {
    for (KernelArg& a : k.args) {
      if (IsOpenInputMaximaSlot(a)) a.param = std::string(kInputMaximaName);
    }
  }
  plan->signature = ForwardSignature(chain, plan->workspace_bytes);
  auto at = plan->signature.end();
  if (!plan->signature.empty() && plan->signature.back().name == kWorkspaceName) --at;
  plan->signature.insert(
      at, TensorSpec{std::string(kInputMaximaName), TensorRole::kInput, DType::kF32, {count}, 16});
  absl::StrAppend(&plan->description, "; max|x| from the ", count,
                  " per-block maxima of the kernel that wrote x (no pass over x)");
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

bool BackwardRunsNatively(const Chain& chain) {
  return (chain.dtype == DType::kBF16 || chain.dtype == DType::kF16) &&
         AnalyzeChain(chain).producer == nullptr;
}

bool BackwardReadsURowsByChannel(const Chain& chain, const PlanTarget& target, bool saved_stats) {
  return PlanBackward(chain, target, saved_stats, ULayout::kRowsByChannel).ok();
}

absl::StatusOr<Plan> PlanBackward(const Chain& chain, const PlanTarget& target, bool saved_stats,
                                  ULayout u_layout, int saved_moment_blocks, DType grad_y_dtype) {
  const ChainInfo info = AnalyzeChain(chain);
  const bool producer = info.producer != nullptr;
  if (chain.dtype != DType::kF32 && !BackwardRunsNatively(chain)) {
    return absl::UnimplementedError(absl::StrCat(
        "no backward plan for the ", DTypeName(chain.dtype), " chain ", FormatChain(chain),
        ": f32 chains have one, and bf16/f16 chains without a convolution"));
  }
  if (grad_y_dtype != DType::kF32 && grad_y_dtype != DType::kBF16 && grad_y_dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("PlanBackward: grad_y in ",
                                                   DTypeName(grad_y_dtype),
                                                   "; the backward reads it in f32, bf16 or f16"));
  }
  if (chain.dtype != DType::kF32 && grad_y_dtype != chain.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlanBackward: grad_y in ", DTypeName(grad_y_dtype), " for the ",
                     DTypeName(chain.dtype), " chain ", FormatChain(chain),
                     "; a 16-bit chain's backward reads grad_y in its own dtype"));
  }
  const bool norm = info.group_norm != nullptr;
  const bool bias = producer && info.producer->conv.bias;
  if (saved_stats && !norm) {
    return absl::InvalidArgumentError(absl::StrCat("PlanBackward: saved group statistics for ",
                                                   FormatChain(chain),
                                                   ", which has no group_norm"));
  }
  if (saved_moment_blocks != 0 &&
      (saved_moment_blocks < 0 || saved_stats || !BackwardReadsSavedMoments(chain))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanBackward: saved channel moments (", saved_moment_blocks, " blocks) for ",
        FormatChain(chain),
        "; only a chain with a convolution ending in group_norm | mean, without saved statistics, "
        "reads them"));
  }
  const bool from_moments = saved_moment_blocks > 0;
  const Shape& p = info.producer_shape;
  const int64_t slices = p[0] * p[1];
  const int64_t spatial = p[2] * p[3] * p[4];
  const std::string u = std::string(producer ? kProducerOutputName : kInputName);
  // Few input channels: one kernel from grad_y's sums to grad_x (few_in_backward.cuh).
  std::string few_in_refusal;
  const std::optional<FewInTile> fused =
      producer ? ChooseFewInTile(chain, info, target, &few_in_refusal) : std::nullopt;
  const std::string gu = std::string(producer && !fused ? kProducerGradName : kGradInputName);
  // The group statistics: recomputed (zpart) unless saved.
  const bool recompute_stats = norm && !saved_stats;
  // grad_y's sums beside a recomputation of u, not a read of it, where the producer is cheap
  // (convt_backward.cuh); not where one pass over u and grad_y gives the statistics too.
  std::string convt_sums_refusal;
  const std::optional<ConvTSums> convt_sums =
      producer && norm && !(recompute_stats && info.post_ops.empty())
          ? ChooseConvTSums(chain, info, target, &convt_sums_refusal)
          : std::nullopt;

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
  if (convt_sums) {
    absl::StrAppend(&plan.description,
                    "; grad_y's sums recompute u (a cheap conv_transpose3d) instead of reading it");
    plan.includes.push_back("convt_backward.cuh");
    plan.tunes.push_back(convt_sums->tune);
  } else if (!convt_sums_refusal.empty() && info.producer->kind == OpKind::kConvTranspose3d) {
    absl::StrAppend(&plan.description, "; grad_y's sums read u (", convt_sums_refusal, ")");
  }

  // The signature of this step.
  std::vector<TensorSpec>& sig = plan.signature;
  sig.push_back({std::string(kInputName), TensorRole::kInput, chain.dtype, chain.input, 16});
  if (producer) {
    TensorSpec spec = SavedProducerOutputSpec(chain, u_layout);
    spec.name = u;
    spec.dtype = chain.dtype;
    sig.push_back(spec);
  }
  if (saved_stats) sig.push_back(SavedStatsSpec(chain));
  if (from_moments) sig.push_back(SavedMomentsSpec(chain, saved_moment_blocks));
  sig.push_back({std::string(kGradOutputName), TensorRole::kGradOutput, grad_y_dtype,
                 OutputShape(chain), 16});
  for (const ParamSpec& ps : ChainParams(chain)) {
    if (ps.op_index == static_cast<size_t>(info.group_norm_index) ||
        ((fused || convt_sums) && ps.name == info.weight_param) ||
        (convt_sums && ps.name == info.bias_param)) {
      sig.push_back({ps.name, TensorRole::kParam, chain.dtype, ps.shape, 16});
    }
  }
  sig.push_back({gu, TensorRole::kGradInput, chain.dtype, fused ? chain.input : p, 16});
  for (const ParamSpec& ps : ChainParams(chain)) {
    sig.push_back({GradName(ps.name), TensorRole::kGradParam, chain.dtype, ps.shape, 16});
  }

  // Elementwise / group_norm part.
  // Chunks per (n, c) slice: the recomputing sums kernel's blocks per sample, or enough to fill
  // the GPU.
  const int64_t split = convt_sums ? convt_sums->blocks_per_sample
                                   : std::clamp<int64_t>(CeilDiv(4 * target.sm_count, slices), 1,
                                                         std::max<int64_t>(1, spatial / 2048));
  // The bias partials' chunks per (n, c): the fused kernel's x tiles, or grad_u's chunks.
  const int64_t bias_split = fused ? fused->g.tiles : split;
  plan.tunes.push_back({"BwdTune",
                        {TuneInt("kSplit", split), TuneInt("kBiasSplit", bias_split),
                         TuneInt("kThreads", kThreads)}});
  const int64_t parts = slices * split;
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
  if (from_moments) {
    // grad_y is one value per (n, c) slice: the sums follow from the forward's moments.
    KernelLaunch m{
        "fj_bwd_sums_from_moments",
        absl::StrCat("fj::bwd_sums_from_moments_kernel<Cfg, BwdTune, ", saved_moment_blocks, ">"),
        "grad_y one value per (n, c) slice: sums of z, z^2, g_h and g_h*z per (n, c) "
        "from the training forward's channel moments (u not read)",
        {static_cast<unsigned>(CeilDiv(slices, kThreads)), 1, 1},
        block};
    KernelArg moments = in("partials", std::string(kSavedMomentsName));
    moments.type = ArgType::kMoments;
    m.args = {moments, in("gy", std::string(kGradOutputName)),
              ws(ArgType::kDouble2, "zpart", zpart, kWrite),
              ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    plan.kernels.push_back(m);
  } else if (recompute_stats && info.post_ops.empty()) {
    // g_h = grad_y: the sums need no statistics, so one pass reads u and grad_y once for both.
    KernelLaunch m{"fj_bwd_moments_sums", "fj::bwd_moments_sums_kernel<Cfg, BwdTune>",
                   "z = pre(u), g_h = grad_y (no op after group_norm): sums of z, z^2, g_h and "
                   "g_h*z per (n, c, chunk) in one pass",
                   grid, block};
    m.args = {in("u", u), in("gy", std::string(kGradOutputName)),
              ws(ArgType::kDouble2, "zpart", zpart, kWrite),
              ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    plan.kernels.push_back(m);
  }
  if (recompute_stats && info.post_ops.empty()) {
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
    const std::vector<KernelArg> sums_args = {in("gy", std::string(kGradOutputName)),
                                              in("gamma", info.gamma_param),
                                              in("beta", info.beta_param),
                                              zpart_in(),
                                              stats_in(),
                                              ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    if (convt_sums) {
      KernelLaunch s = convt_sums->launch;  // x, weight, bias
      s.args.insert(s.args.end(), sums_args.begin(), sums_args.end());
      plan.kernels.push_back(s);
    } else {
      KernelLaunch s{"fj_bwd_sums", "fj::bwd_sums_kernel<Cfg, BwdTune>",
                     "g_h = grad_y * post'(h): sums of g_h and g_h*zhat per (n, c, chunk)", grid,
                     block};
      s.args = {in("u", u)};
      s.args.insert(s.args.end(), sums_args.begin(), sums_args.end());
      plan.kernels.push_back(s);
    }
  }
  if (fused) {
    AddFewInBackward(chain, info, *fused, u, u_layout == ULayout::kRowsByChannel, zpart_in(),
                     stats_in(), norm ? std::optional<size_t>(gpart) : std::nullopt,
                     bias ? std::optional<size_t>(bpart) : std::nullopt, plan);
  }
  // The weight gradient's GEMM (the fused kernel's own where fused).
  std::optional<WeightGradient> wg;
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
    wg = WeightGradient{rows, s_channels, kv, reduction, t_points, s_points, t_grid, a};
  }
  // The grad_u pass leaves max|grad_u| per block (kProducerGradMaximaName) for the GEMMs that
  // scale grad_u by its largest magnitude: the weight gradient's (where its engine does) and step
  // 3's (runtime/backward.cc: ReadInputMaxima).
  std::optional<GradUMaxima> gu_maxima;
  if (producer && !fused) {
    gu_maxima = GradUMaxima{std::string(kProducerGradMaximaName), parts};
    sig.push_back({gu_maxima->tensor, TensorRole::kGradInput, DType::kF32, {parts}, 16});
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
      bias ? ws(ArgType::kDouble, "bpart", bpart, kWrite) : null(ArgType::kDouble, "bpart", kWrite),
      gu_maxima ? KernelArg::Tensor("gmax", gu_maxima->tensor, kWrite)
                : null(ArgType::kFloat, "gmax", kWrite)};
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

  if (wg) {
    AddWeightGradient(
        *wg, chain, info, gu, target, plan,
        WeightGradientReadsGradUMaxima(*wg, chain, target) ? gu_maxima : std::nullopt);
  }
  // u laid out [N, D, H, C, W]: only the fused kernel reads that layout.
  if (u_layout == ULayout::kRowsByChannel) {
    bool reads_elsewhere = !fused;
    for (const KernelLaunch& k : plan.kernels) {
      for (const KernelArg& a : k.args) {
        reads_elsewhere |=
            a.kind == KernelArg::Kind::kTensor && a.param == u && k.symbol != "fj_bwd_few_in";
      }
    }
    if (reads_elsewhere) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PlanBackward: the backward of ", FormatChain(chain),
          " reads u in kernels that take it [N, C, D, H, W], not laid out [N, D, H, C, W]"));
    }
  }
  if (plan.workspace_bytes > 0) {
    sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                   {static_cast<int64_t>(plan.workspace_bytes)}, 256});
  }
  return plan;
}

}  // namespace fusejit::codegen
