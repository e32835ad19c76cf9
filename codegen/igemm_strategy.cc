// The tensor-core strategy for chains whose producer is expensive (many input channels, seed W3):
//   igemm-store-normalize  conv3d | conv_transpose3d (stride 1) | ew* | group_norm | ew*
//       templates/igemm_mma.cuh + igemm_wgmma.cuh + gn_apply.cuh: x is copied channels-last in the
//       operand encoding (prep), an implicit GEMM on Hopper's wgmma (sm_90a) computes the
//       convolution with the pre-norm ops and stores the pre-norm values into y with per-tile
//       group moments; the moments are merged in a fixed order and y is normalized in place.
// Precision: kFp32 runs "F16x3" (x and w split into fp16 high/low pairs, three products, a
// short-run accumulator flushed every 2 k-steps; ~2.5e-7 relative on W3); kTf32, asked for by
// name, runs one TF32 product (~4e-4 relative). Tunings measured on the H100 for W3
// (bench/explore_w3/NOTES.md, final run); smaller shapes fall back to fewer warpgroups / stages.
#include "codegen/igemm_strategy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"

namespace fusejit::codegen {
namespace {

using Kind = KernelArg::Kind;

// Values match fj::IgemmPrec (templates/igemm_mma.cuh).
enum IgemmPrec { kPrecTF32x1 = 0, kPrecF16x3 = 1 };

constexpr int kAbsmaxBlocks = 264;                 // IgemmTune::kAbsmaxBlocks
constexpr int64_t kOptInSharedLimit = 227 * 1024;  // dynamic shared memory per block, sm_90
constexpr int64_t kStaticSharedLimit = 48 * 1024;
constexpr int64_t kTileN = 128;      // output channels per CTA (wgmma n = 128)
constexpr int64_t kHaloPitch = 144;  // bytes per halo point (igemm_wgmma.cuh HaloShape::kPitch)
constexpr int64_t kGnApplyThreads = 128, kGnApplyVec = 4;  // gn_apply.cuh GnApply

// Wrapper parameter types: restrict-qualified, like the standalone kernels that were measured.
constexpr char kConstF32[] = "const float* __restrict__";
constexpr char kF32[] = "float* __restrict__";
constexpr char kConstBytes[] = "const unsigned char* __restrict__";
constexpr char kBytes[] = "unsigned char* __restrict__";

KernelArg Arg(Kind kind, std::string type, std::string name, std::string param = "",
              size_t offset = 0) {
  return {kind, std::move(type), std::move(name), std::move(param), offset};
}
// A null pointer argument (an operand the precision does not use).
KernelArg Null(std::string type, std::string name) {
  return Arg(Kind::kParam, std::move(type), std::move(name));
}

TuneStruct::Field Int(std::string name, int64_t v) {
  return {"int", std::move(name), absl::StrCat(v)};
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct IgemmTune {
  int prec = kPrecF16x3, wg = 3, stages = 7, flush = 2, async = 1;
};

// The compile-time shapes of the templates (IgemmShape, HaloShape, IgemmWgmmaShape, GnApply) for
// a chain and a tuning, computed the same way.
struct IgemmGeometry {
  int64_t s = 0, sin = 0, taps = 0, bm = 0, threads = 0, tiles = 0;
  int64_t smem = 0;  // dynamic shared memory of the GEMM kernel
  int64_t prep_x_blocks_per_sample = 0, prep_w_blocks = 0;
  int64_t apply_blocks_per_row = 0;
};

IgemmGeometry Geometry(const Chain& chain, const ChainInfo& info, const IgemmTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  IgemmGeometry g;
  g.s = p[2] * p[3] * p[4];
  g.sin = x[2] * x[3] * x[4];
  g.taps = conv.kernel[0] * conv.kernel[1] * conv.kernel[2];
  g.bm = 64 * t.wg;
  g.threads = 128 * t.wg;
  g.tiles = CeilDiv(g.s, g.bm);
  const int64_t span_h = (conv.kernel[1] - 1) * conv.dilation[1];
  const int64_t span_w = (conv.kernel[2] - 1) * conv.dilation[2];
  const int64_t halo_cols = p[4] + span_w;
  const int64_t rows_spanned = (g.bm - 1 + p[4] - 1) / p[4] + 1;
  const int64_t halo_rows = rows_spanned + 2 * span_h;
  const int64_t halo_bytes = CeilDiv(halo_rows * halo_cols * kHaloPitch, 1024) * 1024;
  const int64_t pipe = 2 * halo_bytes + t.stages * kTileN * 128;
  const int64_t epilogue = kTileN * (g.bm + 4) * 4;
  g.smem = std::max(pipe, epilogue);
  g.prep_x_blocks_per_sample = CeilDiv(g.sin, 32);
  g.prep_w_blocks = CeilDiv(g.taps * p[1] * (x[1] / 32) * 4, 256);
  const int64_t per_block =
      g.s % 4 == 0 ? kGnApplyThreads * kGnApplyVec * 4 : kGnApplyThreads * kGnApplyVec;
  g.apply_blocks_per_row = CeilDiv(g.s, per_block);
  return g;
}

// What the kernels support, independent of the tuning (each line mirrors a static_assert of the
// templates or a launch limit, so that Applies() never lets one fire).
bool ChainSupported(const Chain& chain, const ChainInfo& info, const PlanTarget& target) {
  if (target.arch != "sm_90" && target.arch != "sm_90a") return false;  // wgmma: sm_90a build
  if (!info.producer || !info.group_norm || info.mean != MeanMode::kNone) return false;
  const ConvAttrs& conv = info.producer->conv;
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  const int64_t n = p[0], c = p[1], groups = info.group_norm->groups;
  if (conv.stride != Dims3{1, 1, 1}) return false;             // stride 1 only
  if (x[1] % 32 != 0) return false;                            // kCin % 32 == 0
  if (x[1] * 33 * 4 + 256 > kStaticSharedLimit) return false;  // prep's static smem tile
  if (c % kTileN != 0) return false;                           // kC % BN == 0, BN = 128
  if (kTileN % (c / groups) != 0) return false;                // a group inside one channel tile
  if (conv.kernel[0] > 8) return false;                        // kKD <= 8 (kd list: 4 bits each)
  if (x[2] * x[3] * x[4] * x[1] * 4 >= (int64_t{1} << 31)) return false;  // sample too large
  if (p[3] * p[4] < 64) return false;            // BM <= kH*kW for one warpgroup
  if (n > 65535 || n * c > 65535) return false;  // grid.z of the GEMM, grid.y of apply
  return true;
}

// Whether `t` satisfies the tuning-dependent requirements.
bool TuneFits(const Chain& chain, const ChainInfo& info, const IgemmTune& t) {
  const ConvAttrs& conv = info.producer->conv;
  const IgemmGeometry g = Geometry(chain, info, t);
  if (g.bm > info.producer_shape[3] * info.producer_shape[4]) return false;  // <= 2 planes a tile
  if (t.stages < 2 || t.stages - 1 > conv.kernel[1] * conv.kernel[2]) return false;  // halo lead
  if (t.async && t.stages < 3) return false;
  return g.smem <= kOptInSharedLimit;
}

// The measured W3 tuning of the precision, else the largest tile that fits with as many stages as
// fit, preferring enough CTAs to fill the device. Returns false when nothing fits.
bool ChooseTune(const Chain& chain, const ChainInfo& info, const PlanTarget& target,
                IgemmTune* out) {
  IgemmTune best;
  bool found = false;
  const bool tf32 = target.precision == Precision::kTf32;
  const int top_wg = tf32 ? 4 : 3, top_stages = tf32 ? 5 : 7;
  const ConvAttrs& conv = info.producer->conv;
  const int64_t n = info.producer_shape[0], ctiles = info.producer_shape[1] / kTileN;
  for (int wg = top_wg; wg >= 1; --wg) {
    IgemmTune t;
    t.prec = tf32 ? kPrecTF32x1 : kPrecF16x3;
    t.flush = tf32 ? 0 : 2;
    t.wg = wg;
    t.stages = static_cast<int>(std::min<int64_t>(top_stages, conv.kernel[1] * conv.kernel[2] + 1));
    auto fits = [&] {
      t.async = t.stages >= 3 ? 1 : 0;
      return TuneFits(chain, info, t);
    };
    while (!fits() && t.stages > 2) --t.stages;
    if (!fits()) continue;
    best = t;
    found = true;
    const int64_t ctas = Geometry(chain, info, t).tiles * ctiles * n;
    if (ctas >= target.sm_count) break;  // enough CTAs; else try smaller tiles
  }
  if (found) *out = best;
  return found;
}

class IgemmStoreNormalizeStrategy : public Strategy {
 public:
  std::string_view name() const override { return "igemm-store-normalize"; }
  bool Applies(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    IgemmTune t;
    return ChainSupported(chain, info, target) && ChooseTune(chain, info, target, &t);
  }
  double Cost(const Chain& chain, const PlanTarget&) const override {
    // y stored, read and written again (12 bytes a point), x copied once (8 bytes a point), the
    // products on the tensor cores at several times the rate of the fp32 FFMA plans.
    const ChainInfo info = AnalyzeChain(chain);
    return static_cast<double>(info.elements) * (12.0 / 3.0 + 2.0 * info.macs_per_point / 400.0) +
           static_cast<double>(NumElements(chain.input)) * 8.0 / 3.0;
  }
  absl::StatusOr<Plan> MakePlan(const Chain& chain, const PlanTarget& target) const override {
    const ChainInfo info = AnalyzeChain(chain);
    IgemmTune t;
    if (!ChainSupported(chain, info, target) || !ChooseTune(chain, info, target, &t)) {
      return absl::FailedPreconditionError("igemm-store-normalize does not apply to this chain");
    }
    const IgemmGeometry g = Geometry(chain, info, t);
    const bool f16 = t.prec == kPrecF16x3;
    const int64_t n = info.producer_shape[0], c = info.producer_shape[1], cin = chain.input[1];
    const int64_t groups = info.group_norm->groups;
    Plan plan;
    plan.strategy = std::string(name());
    plan.description = absl::StrCat(
        "implicit GEMM on the tensor cores (wgmma, sm_90a): x copied channels-last in the operand "
        "encoding, each CTA stages its input rows once per (kd, 32 channels) and streams the "
        "weights; the epilogue stores the pre-norm values into y with per-tile group moments, "
        "merged in a fixed order, then y is normalized in place. ",
        f16 ? "fp32-accurate: fp16 high/low splits of x and w, three products, short-run "
              "accumulator flushed every 2 k-steps"
            : "TF32 (asked for): one TF32 product per term");
    plan.includes = {"igemm_mma.cuh", "igemm_wgmma.cuh", "gn_apply.cuh"};
    plan.arch_override = "sm_90a";
    plan.tunes.push_back(
        {"IgemmTune",
         {Int("kPrec", t.prec), Int("kWG", t.wg), Int("kWarpsM", 4 * t.wg), Int("kWarpsN", 1),
          Int("kWM", 16), Int("kWN", kTileN), Int("kStages", t.stages), Int("kFlushSteps", t.flush),
          Int("kAsync", t.async), Int("kAbsmaxBlocks", kAbsmaxBlocks)}});

    const size_t xa = plan.AddWorkspace(
        absl::StrCat("x channels-last [n][d][h][w][ci] as ",
                     f16 ? "fp16 high/low pairs of x*sx" : "TF32", " (N*Sin*Cin*4 bytes)"),
        static_cast<size_t>(n * g.sin * cin) * 4);
    const size_t wb = plan.AddWorkspace(
        absl::StrCat("weights [tap][co][ci] as ", f16 ? "fp16 high/low pairs of w*sw" : "TF32"),
        static_cast<size_t>(g.taps * c * cin) * 4);
    size_t absmax = 0, scale = 0;
    if (f16) {
      absmax = plan.AddWorkspace("per-block max|x| and max|w| (fp16 scales) x 264 blocks",
                                 2 * kAbsmaxBlocks * 4);
      scale = plan.AddWorkspace("1/(sx*sw)", 4);
    }
    const size_t partials =
        plan.AddWorkspace("per-tile group moments (count, mean, M2) x N*groups*tiles",
                          static_cast<size_t>(n * groups * g.tiles) * 12);
    const size_t stats = plan.AddWorkspace("group statistics (mean, rstd) x N*groups",
                                           static_cast<size_t>(n * groups) * 8);
    const KernelArg x = Arg(Kind::kInput, kConstF32, "x");
    const KernelArg w = Arg(Kind::kParam, kConstF32, "weight", info.weight_param);
    const KernelArg absmax_in =
        f16 ? Arg(Kind::kWorkspace, kConstF32, "absmax", "", absmax) : Null(kConstF32, "absmax");
    const KernelArg scale_in =
        f16 ? Arg(Kind::kWorkspace, kConstF32, "scale", "", scale) : Null(kConstF32, "scale");
    if (f16) {
      KernelLaunch k;
      k.symbol = "fj_igemm_absmax";
      k.body = "fj::igemm_absmax_body<Cfg, IgemmTune>";
      k.purpose = "per-block max|x| and max|w| (power-of-two scales for the fp16 splits)";
      k.grid = {kAbsmaxBlocks, 1, 1};
      k.block = {256, 1, 1};
      k.args = {x, w, Arg(Kind::kWorkspace, kF32, "absmax", "", absmax)};
      plan.kernels.push_back(k);
    }
    KernelLaunch prep;
    prep.symbol = "fj_igemm_prep";
    prep.body = "fj::igemm_prep_body<Cfg, IgemmTune>";
    prep.purpose = f16 ? "x -> channels-last fp16 high/low pairs, weights -> [tap][co][ci] pairs"
                       : "x -> channels-last TF32, weights -> [tap][co][ci] TF32";
    prep.grid = {static_cast<unsigned>(n * g.prep_x_blocks_per_sample + g.prep_w_blocks), 1, 1};
    prep.block = {256, 1, 1};
    prep.min_blocks_per_sm = 8;
    prep.args = {x,
                 w,
                 absmax_in,
                 Arg(Kind::kWorkspace, kBytes, "xa", "", xa),
                 Arg(Kind::kWorkspace, kBytes, "wb", "", wb),
                 f16 ? Arg(Kind::kWorkspace, kF32, "scale", "", scale) : Null(kF32, "scale")};
    plan.kernels.push_back(prep);
    KernelLaunch gemm;
    gemm.symbol = "fj_igemm_wgmma";
    gemm.body = "fj::igemm_wgmma_body<Cfg, IgemmTune>";
    gemm.purpose = absl::StrCat("implicit GEMM ", g.bm, "x", kTileN,
                                " tiles (wgmma) + bias + pre-ops, pre-norm values into y, "
                                "per-tile group moments");
    gemm.grid = {static_cast<unsigned>(g.tiles), static_cast<unsigned>(c / kTileN),
                 static_cast<unsigned>(n)};
    gemm.block = {static_cast<unsigned>(g.threads), 1, 1};
    gemm.min_blocks_per_sm = 1;
    gemm.shared_bytes = static_cast<unsigned>(g.smem);
    gemm.args = {Arg(Kind::kWorkspace, kConstBytes, "xa", "", xa),
                 Arg(Kind::kWorkspace, kConstBytes, "wb", "", wb),
                 Arg(Kind::kParam, kConstF32, "bias", info.bias_param),
                 scale_in,
                 Arg(Kind::kOutput, kF32, "y"),
                 Arg(Kind::kWorkspace, kF32, "partials", "", partials)};
    plan.kernels.push_back(gemm);
    KernelLaunch fin;
    fin.symbol = "fj_gn_finalize";
    fin.body = absl::StrCat("fj::gn_finalize_body<Cfg, ", g.tiles, ">");
    fin.purpose = "merge each (sample, group)'s tile moments in a fixed order -> mean, rstd";
    fin.grid = {static_cast<unsigned>(n * groups), 1, 1};
    fin.block = {256, 1, 1};
    fin.args = {Arg(Kind::kWorkspace, kConstF32, "partials", "", partials),
                Arg(Kind::kWorkspace, kF32, "stats", "", stats)};
    plan.kernels.push_back(fin);
    KernelLaunch apply;
    apply.symbol = "fj_gn_apply";
    apply.body = "fj::gn_apply_body<Cfg>";
    apply.purpose = "normalize y in place, affine, post-ops";
    apply.grid = {static_cast<unsigned>(g.apply_blocks_per_row), static_cast<unsigned>(n * c), 1};
    apply.block = {static_cast<unsigned>(kGnApplyThreads), 1, 1};
    apply.args = {Arg(Kind::kParam, kConstF32, "gamma", info.gamma_param),
                  Arg(Kind::kParam, kConstF32, "beta", info.beta_param),
                  Arg(Kind::kWorkspace, kConstF32, "stats", "", stats),
                  Arg(Kind::kOutput, kF32, "y")};
    plan.kernels.push_back(apply);
    return plan;
  }
};

}  // namespace

void AddIgemmStrategies(std::vector<std::unique_ptr<Strategy>>* out) {
  out->push_back(std::make_unique<IgemmStoreNormalizeStrategy>());
}

}  // namespace fusejit::codegen
