// codegen/strategy_util.h: small helpers the strategies and the backward plan share (kernel
// arguments, register and launch-shape checks, tuning-error text, blocks-per-sample candidates).
#ifndef FUSEJIT_CODEGEN_STRATEGY_UTIL_H_
#define FUSEJIT_CODEGEN_STRATEGY_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codegen/chain_info.h"
#include "codegen/planner.h"
#include "codegen/tune_config.h"

namespace fusejit::codegen {

using Kind = KernelArg::Kind;
constexpr int64_t kStaticSharedLimit = 48 * 1024;

// ceil(a / b) for a >= 0, b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of a grid-stride kernel over `work` items with `threads` threads a block: enough to
// give every item a thread, at most 8 blocks an SM (the loop covers the rest), at least one.
inline unsigned GridStrideBlocks(int64_t work, const PlanTarget& target, int64_t threads = 256) {
  const int64_t blocks =
      std::min<int64_t>(CeilDiv(work, threads), static_cast<int64_t>(target.sm_count) * 8);
  return static_cast<unsigned>(std::max<int64_t>(1, blocks));
}

// An int field of a generated tuning struct (codegen/plan.h TuneStruct).
inline TuneStruct::Field TuneInt(std::string name, int64_t value) {
  return {"int", std::move(name), absl::StrCat(value)};
}

// Dynamic shared memory a block may opt into (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) on
// `arch`, less the 1 KB the runtime reserves; 48 KB where the arch is not known here.
inline int64_t SharedOptInLimit(const std::string& arch) {
  if (arch == "sm_90" || arch == "sm_90a" || arch == "sm_100" || arch == "sm_100a") return 227 * 1024;
  if (arch == "sm_80" || arch == "sm_87") return 163 * 1024;
  if (arch == "sm_86" || arch == "sm_89" || arch == "sm_120") return 99 * 1024;
  if (arch == "sm_75") return 64 * 1024;
  return 48 * 1024;
}

// Whether `arch` ("sm_80", "sm_90a", ...) has cp.async and the mma.sync shapes the fast
// strategies' templates use: compute capability 8.0 or later. Their Applies() require it, so an
// older target (sm_75) gets the generic plans instead of a template NVRTC rejects.
inline bool HasAmpereFeatures(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return false;
  int cc = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) {
    cc = cc * 10 + (arch[i] - '0');
  }
  return cc >= 80;
}

inline int64_t Round4(int64_t v) { return (v + 3) / 4 * 4; }

// Short names for the kernel arguments' access (codegen/plan.h KernelArg).
inline constexpr KernelArg::Access kRead = KernelArg::Access::kRead;
inline constexpr KernelArg::Access kWrite = KernelArg::Access::kWrite;

// x, weight, bias: the producer's inputs, the first arguments of most convolution kernels.
inline std::vector<KernelArg> ProducerArgs(const ChainInfo& info) {
  return {KernelArg::Input(), KernelArg::Param("weight", info.weight_param),
          KernelArg::Param("bias", info.bias_param)};
}

// convt_group_norm.cuh's group_norm_scale_shift<Cfg, `tune`>: one 32-thread block per sample
// merges the workspace `partials` (N x blocks x groups moments) into per-channel (scale, shift) at
// workspace `scale_shift` (N x C float2). The second kernel of the convt-* and mma-convt-* plans.
inline KernelLaunch GroupNormScaleShiftLaunch(const ChainInfo& info, const std::string& tune,
                                              size_t partials, size_t scale_shift) {
  KernelLaunch k;
  k.symbol = "fj_scale_shift";
  k.body = "fj::group_norm_scale_shift<Cfg, " + tune + ">";
  k.purpose = "merge partials in a fixed order -> per-channel scale and shift";
  k.grid = {static_cast<unsigned>(info.producer_shape[0]), 1, 1};
  k.block = {32, 1, 1};
  k.args = {KernelArg::Workspace(ArgType::kMoments, "partials", partials, kRead),
            KernelArg::Param("gamma", info.gamma_param), KernelArg::Param("beta", info.beta_param),
            KernelArg::Workspace(ArgType::kFloat2, "scale_shift", scale_shift, kWrite),
            // Where the kernel stores the group statistics for a training forward
            // (codegen::SaveProducerOutput binds it with u).
            KernelArg::Null(ArgType::kFloat, "stats", kWrite)};
  return k;
}


// Conditions both strategies share: a biased producer of the given kind, a group_norm, at most 32
// channels (per-lane channel registers), and a producer cheap enough to recompute per point.
inline bool CheapProducerWithNorm(const ChainInfo& info, OpKind kind) {
  return info.producer && info.producer->kind == kind && info.producer->conv.bias &&
         info.group_norm && info.producer_shape[1] <= 32 && info.macs_per_point <= 256;
}

// Register cap per thread under __launch_bounds__(threads, min_blocks) on sm_80/sm_90.
inline int64_t RegisterCap(int64_t threads, int64_t min_blocks) {
  return std::min<int64_t>(255, 65536 / (threads * std::max<int64_t>(1, min_blocks)));
}
// Registers a thread needs besides its accumulators (addresses, loop counters, temporaries): a
// rough allowance; a configuration over the cap would spill its accumulators.
constexpr int64_t kRegisterOverhead = 24;

// Checks shared by both strategies' launch shapes.
inline absl::Status CheckBlock(const TuneConfig& c, int64_t threads, int64_t min_blocks) {
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

inline absl::Status Invalid(const TuneConfig& c, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("tune config ", c.ToString(), ": ", why));
}

// What a block of `threads` threads needs to be resident `min_blocks` times an SM of `arch`:
// `shared_bytes` of dynamic shared memory per block (and per SM with 1 KiB reserved per block),
// about `registers` per thread under the cap, and a batch within grid.y's 65535. The checks of
// the mma.sync strategies (mma-moments-mean, mma-direct, mma-convt-*), with the reason.
inline absl::Status CheckResidency(const TuneConfig& c, int64_t shared_bytes, int64_t threads,
                                   int64_t min_blocks, int64_t registers, int64_t batch,
                                   const std::string& arch) {
  const int64_t limit = SharedOptInLimit(arch);
  if (shared_bytes > limit) {
    return Invalid(c, absl::StrCat("needs ", shared_bytes,
                                   " bytes of shared memory per block, "
                                   "at most ",
                                   limit, " on ", arch));
  }
  if (min_blocks * (shared_bytes + 1024) > limit + 1024) {
    return Invalid(c, absl::StrCat("min_blocks ", min_blocks, " blocks of ", shared_bytes,
                                   " bytes of shared memory do not fit an SM of ", arch));
  }
  if (registers > RegisterCap(threads, min_blocks)) {
    return Invalid(
        c, absl::StrCat("~", registers, " registers per thread over the ",
                        RegisterCap(threads, min_blocks), "-register cap of threads x min_blocks"));
  }
  if (batch > 65535) return Invalid(c, absl::StrCat("batch ", batch, " over grid.y's 65535"));
  return absl::OkStatus();
}

// Candidate counts of blocks per sample around the heuristic's `b`: fractions and multiples of it,
// and the counts that fill the device 1..8 times over.
inline std::vector<int64_t> BlocksPerSampleCandidates(int64_t b, int64_t n, const PlanTarget& target) {
  std::vector<int64_t> out;
  for (int64_t v : {b / 4, b / 2, b * 2, b * 4}) out.push_back(std::max<int64_t>(1, v));
  for (int64_t m : {1, 2, 3, 4, 6, 8}) {
    out.push_back(std::max<int64_t>(1, (static_cast<int64_t>(target.sm_count) * m + n - 1) / n));
  }
  return out;
}

// The finalize kernel of the moments strategies (templates/moments_mean.cuh): merges the per-block
// channel moments at workspace offset `partials` (elements of `moments_type`, kMoments or
// kMomentsD) in a fixed order and writes the mean of the group_norm output into y.
inline KernelLaunch MomentsMeanFinalizeLaunch(const ChainInfo& info, const std::string& tune_struct,
                                              ArgType moments_type, size_t partials) {
  KernelLaunch f;
  f.symbol = "fj_moments_mean";
  f.body = absl::StrCat("fj::moments_mean_finalize<Cfg, ", tune_struct, ">");
  f.purpose = "merge moments in a fixed order -> group mean/rstd -> mean of the group_norm output";
  f.grid = {static_cast<unsigned>(info.producer_shape[0]), 1, 1};
  f.block = {32, 1, 1};
  f.args = {KernelArg::Workspace(moments_type, "partials", partials, kRead),
            KernelArg::Param("gamma", info.gamma_param), KernelArg::Param("beta", info.beta_param),
            KernelArg::Output()};
  return f;
}

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_STRATEGY_UTIL_H_
