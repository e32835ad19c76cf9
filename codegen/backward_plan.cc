#include "codegen/backward_plan.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/strategy_util.h"
#include "fusejit/signature.h"

namespace fusejit::codegen {
namespace {

constexpr int kThreads = 256;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

TuneStruct::Field Int(const char* name, int64_t value) {
  return {"int", name, absl::StrCat(value)};
}

// Register tile of the weight-gradient GEMM (templates/wgrad.cuh) for `rows` x `cols`: 4 rows per
// thread (float4 shared reads); the smallest row tile holding the rows (up to 64); the column
// tile, and the threads with it, halved while it is more than twice the columns.
struct WgTile {
  int bm, bn, bk, tm, tn, threads;
};
WgTile ChooseWgTile(int64_t rows, int64_t cols) {
  WgTile t = rows >= 48   ? WgTile{64, 128, 16, 4, 8, 256}
             : rows >= 24 ? WgTile{32, 128, 16, 4, 4, 256}
             : rows >= 12 ? WgTile{16, 256, 16, 4, 4, 256}
             : rows >= 6  ? WgTile{8, 256, 8, 4, 4, 128}
                          : WgTile{4, 512, 8, 4, 4, 128};
  while (t.bn / 2 >= cols && t.threads / 2 >= 64) {
    t.bn /= 2;
    t.threads /= 2;
  }
  return t;
}

}  // namespace

Chain ProducerChain(const Chain& chain) {
  const ChainInfo info = AnalyzeChain(chain);
  Chain c;
  c.input = chain.input;
  c.dtype = chain.dtype;
  c.ops.assign(chain.ops.begin(), chain.ops.begin() + info.producer_index + 1);
  return c;
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

absl::StatusOr<Plan> PlanBackward(const Chain& chain, const PlanTarget& target) {
  if (chain.dtype != DType::kF32) {
    return absl::UnimplementedError(absl::StrCat("no backward plan for dtype ",
                                                 DTypeName(chain.dtype), ": only f32 has one"));
  }
  const ChainInfo info = AnalyzeChain(chain);
  const bool producer = info.producer != nullptr;
  const bool norm = info.group_norm != nullptr;
  const bool bias = producer && info.producer->conv.bias;
  const Shape& p = info.producer_shape;
  const int64_t slices = p[0] * p[1];
  const int64_t spatial = p[2] * p[3] * p[4];
  const std::string u = std::string(producer ? kProducerOutputName : kInputName);
  const std::string gu = std::string(producer ? kProducerGradName : kGradInputName);

  Plan plan;
  plan.strategy = "backward";
  plan.derivatives = true;
  plan.description =
      "grad_y back through mean, the elementwise ops and group_norm to the producer's output "
      "(group statistics recomputed in double), then the parameter gradients as fixed-order sums";
  plan.includes = {"backward.cuh"};

  // The signature of this step.
  std::vector<TensorSpec>& sig = plan.signature;
  sig.push_back({std::string(kInputName), TensorRole::kInput, chain.dtype, chain.input, 16});
  if (producer) sig.push_back({u, TensorRole::kSaved, chain.dtype, p, 16});
  sig.push_back({std::string(kGradOutputName), TensorRole::kGradOutput, chain.dtype,
                 OutputShape(chain), 16});
  for (const ParamSpec& ps : ChainParams(chain)) {
    if (ps.op_index == static_cast<size_t>(info.group_norm_index)) {
      sig.push_back({ps.name, TensorRole::kParam, chain.dtype, ps.shape, 16});
    }
  }
  sig.push_back({gu, TensorRole::kGradInput, chain.dtype, p, 16});
  for (const ParamSpec& ps : ChainParams(chain)) {
    sig.push_back({GradName(ps.name), TensorRole::kGradParam, chain.dtype, ps.shape, 16});
  }

  // Elementwise / group_norm part.
  const int64_t split =
      std::clamp<int64_t>(CeilDiv(4 * target.sm_count, slices), 1, std::max<int64_t>(1, spatial / 2048));
  plan.tunes.push_back({"BwdTune", {Int("kSplit", split), Int("kThreads", kThreads)}});
  const int64_t parts = slices * split;
  const size_t zpart = norm ? plan.AddWorkspace("(sum z, sum z^2) per (n, c, chunk)", parts * 16) : 0;
  const size_t gpart =
      norm ? plan.AddWorkspace("(sum g_h, sum g_h*zhat) per (n, c, chunk)", parts * 16) : 0;
  const size_t bpart = bias ? plan.AddWorkspace("sum grad_u per (n, c, chunk)", parts * 8) : 0;
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
  if (norm) {
    KernelLaunch m{"fj_bwd_moments", "fj::bwd_moments_kernel<Cfg, BwdTune>",
                   "z = pre(u): sums of z and z^2 per (n, c, chunk), for the group statistics",
                   grid, block};
    m.args = {in("u", u), ws(ArgType::kDouble2, "zpart", zpart, kWrite)};
    plan.kernels.push_back(m);
    KernelLaunch s{"fj_bwd_sums", "fj::bwd_sums_kernel<Cfg, BwdTune>",
                   "g_h = grad_y * post'(h): sums of g_h and g_h*zhat per (n, c, chunk)", grid, block};
    s.args = {in("u", u),
              in("gy", std::string(kGradOutputName)),
              in("gamma", info.gamma_param),
              in("beta", info.beta_param),
              ws(ArgType::kDouble2, "zpart", zpart, kRead), ws(ArgType::kDouble2, "gpart", gpart, kWrite)};
    plan.kernels.push_back(s);
  }
  KernelLaunch g{"fj_bwd_grad_u", "fj::bwd_grad_u_kernel<Cfg, BwdTune>",
                 norm ? "grad_u = group_norm's backward of g_h, times pre'(u); conv-bias sums"
                      : "grad_u = grad_y times the ops' derivatives; conv-bias sums",
                 grid, block};
  g.args = {in("u", u),
            in("gy", std::string(kGradOutputName)),
            norm ? in("gamma", info.gamma_param) : null(ArgType::kTensorDType, "gamma", kRead),
            norm ? in("beta", info.beta_param) : null(ArgType::kTensorDType, "beta", kRead),
            norm ? ws(ArgType::kDouble2, "zpart", zpart, kRead) : null(ArgType::kDouble2, "zpart", kRead),
            norm ? ws(ArgType::kDouble2, "gpart", gpart, kRead) : null(ArgType::kDouble2, "gpart", kRead),
            out("gu", gu),
            bias ? ws(ArgType::kDouble, "bpart", bpart, kWrite) : null(ArgType::kDouble, "bpart", kWrite)};
  plan.kernels.push_back(g);
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

  // Weight gradient.
  if (producer) {
    const bool conv = info.producer->kind == OpKind::kConv3d;
    const ConvAttrs& a = info.producer->conv;
    const int64_t rows = conv ? p[1] : chain.input[1];
    const int64_t kv = a.kernel[0] * a.kernel[1] * a.kernel[2];
    const int64_t cols = (conv ? chain.input[1] : p[1]) * kv;
    const int64_t reduction =
        chain.input[0] * (conv ? spatial : chain.input[2] * chain.input[3] * chain.input[4]);
    // On tensor cores (sm_80+) where the rows fill most of a 64-row tile; FFMA otherwise.
    const bool mma = HasAmpereFeatures(target.arch) && rows >= 32;
    const WgTile t = mma ? WgTile{64, 128, 32, 4, 4, 256} : ChooseWgTile(rows, cols);
    const int64_t threads = t.threads;
    const int64_t tiles = CeilDiv(cols, t.bn) * CeilDiv(rows, t.bm);
    const int64_t max_parts_bytes = int64_t{512} << 20;
    const int64_t max_splits = std::max<int64_t>(
        1, std::min(reduction / (64 * t.bk), max_parts_bytes / (rows * cols * 8)));
    int64_t splits = 1;
    if (mma) {
      // One block per SM (its registers): the split count whose blocks fill their waves best
      // (the fewest when tied), at most 64.
      double best = 0;
      for (int64_t s = 1; s <= std::min<int64_t>(64, max_splits); ++s) {
        const int64_t blocks = tiles * s;
        const double fill = static_cast<double>(blocks) /
                            static_cast<double>(CeilDiv(blocks, target.sm_count) * target.sm_count);
        if (fill > best + 1e-9) {
          best = fill;
          splits = s;
        }
      }
    } else {
      // About two blocks per SM in whole waves (rounded down: a last, nearly empty wave costs a
      // whole one), each chunk at least 64 steps long.
      splits = std::clamp<int64_t>(2 * target.sm_count / tiles, 1, max_splits);
    }
    const int64_t chunk = CeilDiv(CeilDiv(reduction, splits), t.bk) * t.bk;
    splits = CeilDiv(reduction, chunk);
    plan.includes.push_back("wgrad.cuh");
    const bool prec3 = target.precision != Precision::kTf32;
    plan.tunes.push_back({"WgTune",
                          {Int("kBM", t.bm), Int("kBN", t.bn), Int("kBK", t.bk), Int("kTM", t.tm),
                           Int("kTN", t.tn), Int("kThreads", threads), Int("kSplits", splits),
                           Int("kChunk", chunk)}});
    if (mma) plan.tunes.back().fields.push_back(Int("kPrec3", prec3 ? 1 : 0));
    const size_t wpart =
        plan.AddWorkspace("weight-gradient partials per reduction chunk (double)",
                          static_cast<size_t>(splits * rows * cols * 8));
    KernelLaunch w{
        "fj_wgrad_partial",
        mma ? "fj::wgrad_mma_partial_kernel<Cfg, WgTune>" : "fj::wgrad_partial_kernel<Cfg, WgTune>",
        absl::StrCat("weight gradient: ", rows, " x ", cols, " GEMM over ", reduction,
                     " (n, point) pairs in ", splits, " chunks (",
                     mma ? (prec3 ? "tensor cores, 3xTF32" : "tensor cores, TF32") : "FFMA",
                     ", double partials)"),
        {static_cast<unsigned>(CeilDiv(cols, t.bn)), static_cast<unsigned>(CeilDiv(rows, t.bm)),
         static_cast<unsigned>(splits)},
        {static_cast<unsigned>(threads), 1, 1}};
    w.args = {in("x", std::string(kInputName)),
              in("gu", gu), ws(ArgType::kDouble, "part", wpart, kWrite)};
    plan.kernels.push_back(w);
    KernelLaunch wr{"fj_wgrad_reduce", "fj::wgrad_reduce_kernel<Cfg, WgTune>",
                    "weight gradient: sum the chunks in order",
                    {static_cast<unsigned>(CeilDiv(rows * cols, kThreads)), 1, 1},
                    {kThreads, 1, 1}};
    wr.args = {ws(ArgType::kDouble, "part", wpart, kRead),
               out("grad_w", GradName(info.weight_param))};
    plan.kernels.push_back(wr);
  }
  if (plan.workspace_bytes > 0) {
    sig.push_back({std::string(kWorkspaceName), TensorRole::kWorkspace, DType::kF32,
                   {static_cast<int64_t>(plan.workspace_bytes)}, 256});
  }
  return plan;
}

}  // namespace fusejit::codegen
