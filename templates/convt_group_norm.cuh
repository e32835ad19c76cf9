// templates/convt_group_norm.cuh: "conv_transpose3d (few input channels) | ew* | group_norm | ew*"
// without any intermediate tensor (seed W1), by recomputing the cheap transposed convolution:
//   1. convt_group_moments  : conv_transpose3d + Cfg::pre, per-block per-group moments, no writes
//                             of the big tensor;
//   2. group_norm_scale_shift: merges the partials (fixed order) -> per (n, c) scale a and shift b
//                             with gn(v) = v * a + b, a = gamma_c * rstd_g, b = beta_c - mu_g * a;
//   3. convt_norm_write     : recomputes conv_transpose3d + pre, y = post(pre(v) * a + b), writes y
//                             once (coalesced 4-byte streaming stores, each warp one output row).
//
// Transposed conv by output phase: output o = S*q + r gets taps k with (r + P - k*Dil) % S == 0
// from input i = q + (r + P - k*Dil) / S, so no zero taps are visited. Work unit of one warp:
// kRowsPerUnit output rows (n, od, oh_k = S_H*(ub*RB + k) + rh) of the same h phase rh (phases are
// warp-uniform); lane l owns q = l + 32 j and computes the S_W outputs w = S_W*q + rw for ALL
// output channels and all rows of the unit, so each weight feeds RB FFMAs per lane. Runtime loops
// over the phase's (kd, kh) taps keep the loop body small (instruction cache); ci, kw unrolled.
// Weights: each block copies weight+bias (global, PyTorch layout) to shared memory as
// [kd][kh][ci][kw][C padded to 4]; one 16-byte broadcast load feeds 4*RB FFMAs. (A first version
// with weights in __constant__ memory and one fully unrolled path per phase ran 9x slower: sm_90
// ptxas loads each constant with ULDC, and 4 x 20 KB code paths thrashed the instruction cache.)
//
// Rows narrower than a warp: when an h phase has at most 16 q values (kWq), a warp works on
// kLR = 32 / kLPR rows side by side (lane l: row part l / kLPR, q = l % kLPR), so no lane idles.
//
// A second plan for producers too expensive to compute twice ("convt-store-normalize"): pass 1
// also stores the pre-norm values into y (kStore = true), and convt_apply_inplace normalizes y in
// place instead of pass 3.
//
// A third for chains without group_norm ("convt-direct": conv_transpose3d | ew*):
// convt_direct_write is pass 3 alone, y = pre(v) (every op is a pre op there).
//
// Host-side contract (launch in this order on one stream; no constant-memory copies):
//   1. convt_moments_body<Cfg,Tune>(x, weight, bias, partials, u) (recompute plan), or
//      convt_group_moments<Cfg,Tune,true>(x, weight, bias, partials, y) (store plan):
//        grid = dim3(Tune::kStatBlocksPerSample, Cfg::kN), block = dim3(Tune::kThreads),
//        dynamic smem ConvTGeom<Cfg,Tune>::kDynSmemBytes (raise the attribute above 48 KB);
//        reads x [N,Cin,Din,Hin,Win], weight [Cin,C,KD,KH,KW], bias [C];
//        writes partials: workspace of kN * kStatBlocksPerSample * kGroups fj::Moments (12 B each),
//        layout [N][kStatBlocksPerSample][G], all written; with u (not null: the training
//        forward) every element of u [N, C, D, H, W] ([N, D, H, C, W] where Tune has
//        kURowsByChannel = true: URowsByChannel) as f32 conv_transpose3d + bias; with kStore
//        every element of y [N, C, D, H, W] as Cfg::pre(conv_transpose3d + bias).
//   2. group_norm_scale_shift<Cfg,Tune>(partials, gamma, beta, scale_shift, stats):
//        grid = dim3(Cfg::kN), block = dim3(32); writes scale_shift: workspace of kN * kC float2;
//        with stats not null (the training forward: codegen::SaveProducerOutput) the group
//        statistics as float [N][G][2] (mean, rstd), which the backward reads instead of
//        recomputing them from u.
//   3. convt_norm_write<Cfg,Tune>(x, weight, bias, scale_shift, y):
//        grid = dim3(Tune::kWriteBlocksPerSample, Cfg::kN), block = dim3(Tune::kThreads), dynamic
//        smem kDynSmemBytes; writes every element of y [N, C, D, H, W].
//   or 3'. convt_apply_inplace<Cfg,Tune>(scale_shift, y) (after pass 1 with kStore):
//        grid = dim3(ConvTGeom::kApplyBlocksPerRow, Cfg::kN * Cfg::kC), block = dim3(256);
//        y = post(y * a + b) in place.
//   x, weight, bias, gamma, beta and y are of the chain's element type ElemT<Cfg> (f32, bf16 or
//   f16: widened exactly as loaded, all arithmetic and statistics in f32, y rounded once); the
//   store plan (kStore, convt_apply_inplace) keeps pre-norm values in y and needs f32.
//   Workspace total: kN*kStatBlocksPerSample*kGroups*12 + kN*kC*8 bytes. Dynamic smem:
//   kDynSmemBytes = 4*(KD*KH*Cin*KW*round4(C) + round4(C)) bytes of weights; static: the reduction
//   scratch (kThreads/32 * (2G+1) floats) and 8*C bytes of (scale, shift).
// The direct plan alone: convt_direct_write<Cfg,Tune>(x, weight, bias, y, u), launched as pass 3
//   (grid kWriteBlocksPerSample x kN), no workspace, no static smem; writes every element of y and,
//   with u not null (the training forward), of u (f32 conv_transpose3d + bias; laid out as pass 1
//   lays it).
// Requirements (static_assert): kProducer == kConvTranspose3d, kC <= 32, kBias; kGroups > 0 but
// for the direct plan (kGroups == 0, no mean).
#ifndef FUSEJIT_TEMPLATES_CONVT_GROUP_NORM_CUH_
#define FUSEJIT_TEMPLATES_CONVT_GROUP_NORM_CUH_

#include "common.cuh"
#include "default_config.cuh"  // enums (kConv3d, kMeanAll, ...); include-guarded
#include "moments_util.cuh"

namespace fj {

struct ConvTGroupNormTune {
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocksPerSM = 2;
  static constexpr int kRowsPerUnit = 1;  // output rows (same h phase) per warp unit
  static constexpr int kStatBlocksPerSample = 4;
  static constexpr int kWriteBlocksPerSample = 4;
  static constexpr bool kStreamingStores = true;
  static constexpr bool kCoalesceStores = true;  // shuffle-transpose so each store is 128 B
};

template <class Cfg, class Tune>
struct ConvTGeom {
  static constexpr int S_D = Cfg::kSD, S_H = Cfg::kSH, S_W = Cfg::kSW;
  static constexpr int RB = Tune::kRowsPerUnit;
  static constexpr int kWq = (Cfg::kW + S_W - 1) / S_W;  // q values per output row
  // Lanes per row: a power of two >= kWq (at least 4, at most 32); kLR rows side by side.
  static constexpr int kLPR = kWq > 16 ? 32 : kWq > 8 ? 16 : kWq > 4 ? 8 : 4;
  static constexpr int kLR = 32 / kLPR;
  static constexpr int kJ = (kWq + kLPR - 1) / kLPR;     // q chunks per lane
  static constexpr int kHq = (Cfg::kH + S_H - 1) / S_H;  // rows per h phase (upper bound)
  static constexpr int kUh = (kHq + RB * kLR - 1) / (RB * kLR);  // units per (od, rh)
  static constexpr int kUnits = Cfg::kD * S_H * kUh;      // units per sample
  static constexpr int kCPG = Cfg::kGroups > 0 ? Cfg::kC / Cfg::kGroups : 1;
  static constexpr int kCp = (Cfg::kC + 3) / 4 * 4;
  // weights in smem: [kd][kh][ci][kw][Cp], bias [Cp] after them
  static constexpr int kSmemW = Cfg::kKD * Cfg::kKH * Cfg::kCin * Cfg::kKW * kCp + kCp;
  static constexpr int kDynSmemBytes = 4 * kSmemW;
  static constexpr size_t kPlane = (size_t)Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr int kApplyVec = kPlane % 4 == 0 ? 4 : 1;
  static constexpr int kApplyBlocksPerRow = (int)((kPlane / kApplyVec + 255) / 256);
  // Does kernel tap k contribute to output phase r?  offset of its input index from q.
  __host__ __device__ static constexpr bool tap(int r, int k, int P, int dil, int S) {
    return ((r + P - k * dil) % S + S) % S == 0;
  }
  __host__ __device__ static constexpr int off(int r, int k, int P, int dil, int S) {
    return (r + P - k * dil) / S;  // exact when tap() holds
  }
};

// The global source of shared weight slot i ([kd][kh][ci][kw][Cp], then bias [Cp]): weight
// [Cin][C][KD][KH][KW] or bias [C], or nullptr for a padding channel (zero).
template <class Cfg, class Tune, class E>
__device__ __forceinline__ const E* convt_weight_src(int i, const E* __restrict__ weight,
                                                     const E* __restrict__ bias) {
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int C = Cfg::kC, Cp = T::kCp, KD = Cfg::kKD, KH = Cfg::kKH, KW = Cfg::kKW, Ci = Cfg::kCin;
  if (i >= T::kSmemW - Cp) {
    const int co = i - (T::kSmemW - Cp);
    return co < C ? bias + co : nullptr;
  }
  const int co = i % Cp;
  int r = i / Cp;
  const int kw = r % KW; r /= KW;
  const int ci = r % Ci; r /= Ci;
  const int kh = r % KH;
  const int kd = r / KH;
  return co < C ? weight + (((ci * C + co) * KD + kd) * KH + kh) * KW + kw : nullptr;
}

// Copies weight and bias into s_w as float ([kd][kh][ci][kw][Cp], then bias); padding channels
// are zeroed. f32: 4-byte cp.async, all of a thread's copies in flight at once (a scalar
// load/store loop waits one L2 round trip per element, which for 55 KB of weights and small
// blocks cost more than the convolution). bf16/f16: widened through registers, four loads in
// flight per thread. Each thread waits for its own copies; the caller's __syncthreads()
// publishes them.
template <class Cfg, class Tune, class E>
__device__ __forceinline__ void convt_load_weights(const E* __restrict__ weight,
                                                   const E* __restrict__ bias, float* s_w) {
  using T = ConvTGeom<Cfg, Tune>;
  if constexpr (is_same_v<E, float>) {
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(s_w));
    for (int i = threadIdx.x; i < T::kSmemW; i += blockDim.x) {
      const float* src = convt_weight_src<Cfg, Tune>(i, weight, bias);
      if (src != nullptr) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(base + 4u * i), "l"(src)
                     : "memory");
      } else {
        s_w[i] = 0.f;
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  } else {
    constexpr int kInFlight = 4;
    for (int i0 = threadIdx.x; i0 < T::kSmemW; i0 += kInFlight * blockDim.x) {
      float v[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const int i = i0 + k * blockDim.x;
        const E* src = i < T::kSmemW ? convt_weight_src<Cfg, Tune>(i, weight, bias) : nullptr;
        v[k] = src != nullptr ? ldg_f32(src) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        if (i0 + k * blockDim.x < T::kSmemW) s_w[i0 + k * blockDim.x] = v[k];
      }
    }
  }
}

// Stores v as y's element type E (rounded once), with the streaming (evict-first) hint when
// kStreaming.
template <bool kStreaming, class E>
__device__ __forceinline__ void convt_store(E* p, float v) {
  if constexpr (is_same_v<E, float>) {
    if constexpr (kStreaming) __stcs(p, v);
    else *p = v;
  } else {
    const E e = from_f32<E>(v);
    if constexpr (kStreaming) __stcs(reinterpret_cast<unsigned short*>(p), e.bits);
    else *p = e;
  }
}

// acc[k][rw][co] = conv_transpose3d at (od, oh_k = S_H*(ub*RB + k) + rh, ow = S_W*q + rw).
// Runtime loops over the phase's (kd, kh) taps (warp-uniform branches), ci and kw unrolled.
template <class Cfg, class Tune, class E>
__device__ __forceinline__ void convt_unit(const E* __restrict__ xn, const float* s_w, int od,
                                           int rh, int ub, int q,
                                           float (&acc)[Tune::kRowsPerUnit][Cfg::kSW][Cfg::kC]) {
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int C = Cfg::kC, Cp = T::kCp, SW = Cfg::kSW, KD = Cfg::kKD, KH = Cfg::kKH, KW = Cfg::kKW;
  constexpr int Din = Cfg::kDin, Hin = Cfg::kHin, Win = Cfg::kWin, RB = T::RB;
  constexpr int omax = (SW - 1 + Cfg::kPW) / SW + 1;
  constexpr int omin = -((KW - 1) * Cfg::kDilW) / SW - 1;
  constexpr int NO = omax - omin + 1;
  const float* bias = s_w + (T::kSmemW - Cp);
#pragma unroll
  for (int k = 0; k < RB; ++k)
#pragma unroll
    for (int rw = 0; rw < SW; ++rw)
#pragma unroll
      for (int co = 0; co < C; ++co) acc[k][rw][co] = bias[co];
  const int qd = od / Cfg::kSD, rd = od - qd * Cfg::kSD;
#pragma unroll 1
  for (int kd = 0; kd < KD; ++kd) {
    if (!T::tap(rd, kd, Cfg::kPD, Cfg::kDilD, Cfg::kSD)) continue;
    const int id = qd + T::off(rd, kd, Cfg::kPD, Cfg::kDilD, Cfg::kSD);
    if (id < 0 || id >= Din) continue;
#pragma unroll 1
    for (int kh = 0; kh < KH; ++kh) {
      if (!T::tap(rh, kh, Cfg::kPH, Cfg::kDilH, Cfg::kSH)) continue;
      const int ihb = ub * RB + T::off(rh, kh, Cfg::kPH, Cfg::kDilH, Cfg::kSH);
      const float* swk = s_w + (kd * KH + kh) * Cfg::kCin * KW * Cp;
#pragma unroll
      for (int ci = 0; ci < Cfg::kCin; ++ci) {
        float xw[RB][NO];
#pragma unroll
        for (int k = 0; k < RB; ++k) {
          const int ih = ihb + k;
          const bool hok = ih >= 0 && ih < Hin;
          const E* __restrict__ xr =
              xn + ((size_t)(ci * Din + id) * Hin + min(max(ih, 0), Hin - 1)) * Win;
#pragma unroll
          for (int o = 0; o < NO; ++o) {
            bool used = false;
#pragma unroll
            for (int rw = 0; rw < SW; ++rw)
#pragma unroll
              for (int kw = 0; kw < KW; ++kw)
                if (T::tap(rw, kw, Cfg::kPW, Cfg::kDilW, SW) &&
                    T::off(rw, kw, Cfg::kPW, Cfg::kDilW, SW) - omin == o)
                  used = true;
            if (!used) continue;
            const int iw = q + o + omin;
            const bool ok = hok && iw >= 0 && iw < Win;
            const float v = ldg_f32(xr + min(max(iw, 0), Win - 1));
            xw[k][o] = ok ? v : 0.f;
          }
        }
        const float4* __restrict__ sp = reinterpret_cast<const float4*>(swk + ci * KW * Cp);
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          float wv[Cp];
#pragma unroll
          for (int j = 0; j < Cp / 4; ++j) {
            const float4 w4 = sp[kw * (Cp / 4) + j];
            wv[4 * j] = w4.x;
            wv[4 * j + 1] = w4.y;
            wv[4 * j + 2] = w4.z;
            wv[4 * j + 3] = w4.w;
          }
#pragma unroll
          for (int rw = 0; rw < SW; ++rw) {
            if (!T::tap(rw, kw, Cfg::kPW, Cfg::kDilW, SW)) continue;
            const int o = T::off(rw, kw, Cfg::kPW, Cfg::kDilW, SW) - omin;
#pragma unroll
            for (int k = 0; k < RB; ++k)
#pragma unroll
              for (int co = 0; co < C; ++co) acc[k][rw][co] = fmaf(xw[k][o], wv[co], acc[k][rw][co]);
          }
        }
      }
    }
  }
}

// What every kernel here needs of the convolution; the normalizing plans also need group_norm.
template <class Cfg>
__device__ __forceinline__ void convt_conv_checks() {
  static_assert(Cfg::kProducer == kConvTranspose3d,
                "convt_group_norm: producer must be conv_transpose3d");
  static_assert(Cfg::kC <= 32, "convt_group_norm: kC <= 32 (per-lane channel registers)");
  static_assert(Cfg::kBias, "convt_group_norm: needs the convolution's bias");
}
template <class Cfg>
__device__ __forceinline__ void convt_static_checks() {
  convt_conv_checks<Cfg>();
  static_assert(Cfg::kGroups > 0 && Cfg::kC % Cfg::kGroups == 0,
                "convt_group_norm: needs group_norm");
}

// Decodes unit u of a sample: od, rh, ub.
template <class Cfg, class Tune>
__device__ __forceinline__ void convt_unit_coords(int u, int& od, int& rh, int& ub) {
  using T = ConvTGeom<Cfg, Tune>;
  ub = u % T::kUh;
  const int t = u / T::kUh;
  rh = t % Cfg::kSH;
  od = t / Cfg::kSH;
}

// The work of this warp in a pass of kBlocksPerSample blocks a sample: f(od, rh, ub, q) for each
// of its units (blockIdx.x * WPB + warp, + kBlocksPerSample * WPB, ...) that has a valid row and
// each of the unit's q chunks, with this lane's row block ub and q value (ConvTGeom's notation;
// od and rh are warp-uniform). Every pass here visits its units this way.
template <class Cfg, class Tune, int kBlocksPerSample, class F>
__device__ __forceinline__ void convt_for_each_unit(F&& f) {
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int WPB = Tune::kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / T::kLPR, ql = lane % T::kLPR;
#pragma unroll 1
  for (int unit = blockIdx.x * WPB + warp; unit < T::kUnits; unit += kBlocksPerSample * WPB) {
    int od, rh, ub0;
    convt_unit_coords<Cfg, Tune>(unit, od, rh, ub0);
    if (Cfg::kSH * ub0 * T::kLR * T::RB + rh >= Cfg::kH) continue;  // no valid row (warp-uniform)
    const int ub = ub0 * T::kLR + sub;                              // this lane's row block
#pragma unroll 1
    for (int j = 0; j < T::kJ; ++j) f(od, rh, ub, ql + T::kLPR * j);
  }
}

// Stores this lane's Cfg::kSW values v[rw] (ow = kSW * q + rw) of one output row into
// row[0, kW). kCoalesce: transposed through shuffles so that store e of the warp writes
// ow = 32 e + lane (full 128-byte lines) instead of every kSW-th value (REQUIRES: the warp's lanes
// hold q = 0..31 of one row).
template <class Cfg, class Tune, bool kCoalesce, class D>
__device__ __forceinline__ void convt_store_row(D* __restrict__ row, const float (&v)[Cfg::kSW],
                                                int q, int lane) {
  constexpr int SW = Cfg::kSW;
  if constexpr (kCoalesce) {
#pragma unroll
    for (int e = 0; e < SW; ++e) {
      const int ow = 32 * e + lane;
      const int src = ow / SW, sel = ow - (ow / SW) * SW;
      float out = 0.f;
#pragma unroll
      for (int rw = 0; rw < SW; ++rw) {
        const float t = __shfl_sync(0xffffffffu, v[rw], src & 31);
        out = sel == rw ? t : out;
      }
      if (ow < Cfg::kW) convt_store<Tune::kStreamingStores>(row + ow, out);
    }
  } else {
#pragma unroll
    for (int rw = 0; rw < SW; ++rw) {
      const int ow = SW * q + rw;
      if (ow < Cfg::kW) convt_store<Tune::kStreamingStores>(row + ow, v[rw]);
    }
  }
}

// Stores the unit's convolution outputs acc (bias added, before any op) into un, sample n's u
// (f32) [C][D][H][W], or [D][H][C][W] where Tune has kURowsByChannel (URowsByChannel: the unit's
// rows of every channel then lie side by side, stored one after the other), with the write pass's
// store pattern (coalesced when a warp holds one row).
template <class Cfg, class Tune>
__device__ __forceinline__ void convt_store_u(
    float* __restrict__ un, const float (&acc)[Tune::kRowsPerUnit][Cfg::kSW][Cfg::kC], int od,
    int rh, int ub, int q, int lane) {
  using T = ConvTGeom<Cfg, Tune>;
  constexpr bool kCoalesce = Tune::kCoalesceStores && T::kJ == 1 && T::kLR == 1;
#pragma unroll
  for (int k = 0; k < T::RB; ++k) {
    const int oh = Cfg::kSH * (ub * T::RB + k) + rh;
    if (oh >= Cfg::kH) continue;  // warp-uniform when kLR == 1
    const size_t row = (size_t)od * Cfg::kH + oh;
#pragma unroll
    for (int co = 0; co < Cfg::kC; ++co) {
      float w[Cfg::kSW];
#pragma unroll
      for (int rw = 0; rw < Cfg::kSW; ++rw) w[rw] = acc[k][rw][co];
      float* const dst = URowsByChannel<Tune>::value ? un + (row * Cfg::kC + co) * Cfg::kW
                                                     : un + co * T::kPlane + row * Cfg::kW;
      convt_store_row<Cfg, Tune, kCoalesce>(dst, w, q, lane);
    }
  }
}

template <class Cfg, class Tune, bool kStore = false, bool kSaveU = false>
__device__ __forceinline__ void convt_group_moments(const ElemT<Cfg>* __restrict__ x,
                                                    const ElemT<Cfg>* __restrict__ weight,
                                                    const ElemT<Cfg>* __restrict__ bias,
                                                    Moments* __restrict__ partials,
                                                    float* __restrict__ y = nullptr,
                                                    float* __restrict__ u = nullptr) {
  convt_static_checks<Cfg>();
  using E = ElemT<Cfg>;
  static_assert(!kStore || is_same_v<E, float>,
                "convt_group_moments: the pre-norm values are stored into an f32 y only");
  static_assert(!(kStore && kSaveU), "convt_group_moments: u is saved by the recompute plan only");
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int C = Cfg::kC, G = Cfg::kGroups, CPG = T::kCPG, SW = Cfg::kSW, RB = T::RB;
  constexpr int WPB = Tune::kThreads / 32;
  extern __shared__ __align__(16) float fj_convt_smem[];
  float* s_w = fj_convt_smem;
  __shared__ float s_red[WPB * (2 * G + 1)];
  convt_load_weights<Cfg, Tune>(weight, bias, s_w);
  __syncthreads();
  const int n = blockIdx.y, lane = threadIdx.x & 31;
  const E* __restrict__ xn = x + (size_t)n * Cfg::kCin * Cfg::kDin * Cfg::kHin * Cfg::kWin;
  float* __restrict__ yn = kStore ? y + (size_t)n * C * T::kPlane : nullptr;
  float* __restrict__ un = kSaveU ? u + (size_t)n * C * T::kPlane : nullptr;
  float run_n = 0.f, run_m[G], run_q[G];
#pragma unroll
  for (int g = 0; g < G; ++g) run_m[g] = run_q[g] = 0.f;

  convt_for_each_unit<Cfg, Tune, Tune::kStatBlocksPerSample>([&](int od, int rh, int ub, int q) {
    int nvh = 0;  // valid rows of this lane's row block
#pragma unroll
    for (int k = 0; k < RB; ++k) nvh += (Cfg::kSH * (ub * RB + k) + rh < Cfg::kH) ? 1 : 0;
    float acc[RB][SW][C];
    convt_unit<Cfg, Tune>(xn, s_w, od, rh, ub, q, acc);
    if constexpr (kSaveU) convt_store_u<Cfg, Tune>(un, acc, od, rh, ub, q, lane);
    int nvw = 0;
#pragma unroll
    for (int rw = 0; rw < SW; ++rw) nvw += (SW * q + rw < Cfg::kW) ? 1 : 0;
    const float tcnt = (float)(nvh * nvw * CPG);
    const float inv = tcnt > 0.f ? 1.f / tcnt : 0.f;
    const float wb = chan_weight(run_n, tcnt);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float v[RB][SW][CPG];
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < RB; ++k)
#pragma unroll
        for (int rw = 0; rw < SW; ++rw)
#pragma unroll
          for (int c = 0; c < CPG; ++c) {
            v[k][rw][c] = Cfg::pre(acc[k][rw][g * CPG + c]);
            const bool ok = (k < nvh) && (SW * q + rw < Cfg::kW);
            s += ok ? v[k][rw][c] : 0.f;
            if constexpr (kStore) {
              if (ok) {
                const int oh = Cfg::kSH * (ub * RB + k) + rh;
                yn[(g * CPG + c) * T::kPlane + ((size_t)od * Cfg::kH + oh) * Cfg::kW + SW * q +
                   rw] = v[k][rw][c];
              }
            }
          }
      const float tm = s * inv;
      float qq = 0.f;
#pragma unroll
      for (int k = 0; k < RB; ++k)
#pragma unroll
        for (int rw = 0; rw < SW; ++rw)
#pragma unroll
          for (int c = 0; c < CPG; ++c) {
            const bool ok = (k < nvh) && (SW * q + rw < Cfg::kW);
            const float dv = ok ? v[k][rw][c] - tm : 0.f;
            qq = fmaf(dv, dv, qq);
          }
      chan_merge_w(run_m[g], run_q[g], run_n, tm, qq, wb);
    }
    run_n += tcnt;
  });
  block_reduce_shared_count_store<G>(run_n, run_m, run_q, s_red,
                                     partials + ((size_t)n * Tune::kStatBlocksPerSample + blockIdx.x) * G);
}

// The recompute plan's pass 1. u, when not null (the training forward:
// codegen::SaveProducerOutput), also gets the convolution's output (bias added, before any op) as
// float [N][C][D][H][W] ([N][D][H][C][W] with Tune::kURowsByChannel), every element, stored by this
// pass rather than the write pass: it is the lighter of the two (0.37 against 0.70 ms on W1), and
// u's 1 GB there balances the passes. A branch of its own: the plain forward's code is as without
// u.
template <class Cfg, class Tune>
__device__ __forceinline__ void convt_moments_body(const ElemT<Cfg>* __restrict__ x,
                                                   const ElemT<Cfg>* __restrict__ weight,
                                                   const ElemT<Cfg>* __restrict__ bias,
                                                   Moments* __restrict__ partials,
                                                   float* __restrict__ u) {
  if (u != nullptr) {
    convt_group_moments<Cfg, Tune, false, true>(x, weight, bias, partials, nullptr, u);
  } else {
    convt_group_moments<Cfg, Tune>(x, weight, bias, partials);
  }
}

template <class Cfg, class Tune>
__device__ __forceinline__ void group_norm_scale_shift(const Moments* __restrict__ partials,
                                                       const ElemT<Cfg>* __restrict__ gamma,
                                                       const ElemT<Cfg>* __restrict__ beta,
                                                       float2* __restrict__ scale_shift,
                                                       float* __restrict__ stats = nullptr) {
  convt_static_checks<Cfg>();
  constexpr int C = Cfg::kC, G = Cfg::kGroups, CPG = C / G, B = Tune::kStatBlocksPerSample;
  __shared__ float s_mu[G], s_rstd[G];
  const int n = blockIdx.x, lane = threadIdx.x;
  if (lane < G) {
    float gn = 0.f, gm = 0.f, gq = 0.f;
    for (int b = 0; b < B; ++b) {  // fixed order
      const Moments p = partials[((size_t)n * B + b) * G + lane];
      const float wb = chan_weight(gn, p.count);
      chan_merge_w(gm, gq, gn, p.mean, p.m2, wb);
      gn += p.count;
    }
    s_mu[lane] = gm;
    s_rstd[lane] = 1.f / sqrtf(gq / gn + Cfg::kEps);
    if (stats != nullptr) {  // the training forward saves them for the backward
      stats[2 * ((size_t)n * G + lane)] = gm;
      stats[2 * ((size_t)n * G + lane) + 1] = s_rstd[lane];
    }
  }
  __syncwarp();
  if (lane < C) {
    const int g = lane / CPG;
    const float a = ldg_f32(gamma + lane) * s_rstd[g];
    scale_shift[(size_t)n * C + lane] = make_float2(a, fmaf(-s_mu[g], a, ldg_f32(beta + lane)));
  }
}

// The write pass's work units (see convt_norm_write): y = post(pre(v) * a_c + b_c) with kNormalize
// (s_ab: per-channel (a, b)), else y = pre(v) (the direct plan: no group_norm, so every op is a
// pre op; s_ab unused) and, with kSaveU, u = v.
template <class Cfg, class Tune, bool kNormalize, bool kSaveU = false>
__device__ __forceinline__ void convt_write_units(const ElemT<Cfg>* __restrict__ xn,
                                                  const float* s_w, const float2* s_ab,
                                                  ElemT<Cfg>* __restrict__ yn,
                                                  float* __restrict__ un = nullptr) {
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int C = Cfg::kC, SW = Cfg::kSW, RB = T::RB;
  constexpr bool kCoalesce = Tune::kCoalesceStores && T::kJ == 1 && T::kLR == 1;
  constexpr int WPB = Tune::kThreads / 32;
  constexpr size_t kPlane = T::kPlane;
  const int lane = threadIdx.x & 31;
  convt_for_each_unit<Cfg, Tune, Tune::kWriteBlocksPerSample>([&](int od, int rh, int ub, int q) {
    float acc[RB][SW][C];
    convt_unit<Cfg, Tune>(xn, s_w, od, rh, ub, q, acc);
    if constexpr (kSaveU) convt_store_u<Cfg, Tune>(un, acc, od, rh, ub, q, lane);
#pragma unroll
    for (int k = 0; k < RB; ++k) {
      const int oh = Cfg::kSH * (ub * RB + k) + rh;
      if (oh >= Cfg::kH) continue;  // warp-uniform when kLR == 1
      const size_t row = ((size_t)od * Cfg::kH + oh) * Cfg::kW;
#pragma unroll
      for (int co = 0; co < C; ++co) {
        float v[SW];
        if constexpr (kNormalize) {
          const float2 ab = s_ab[co];
#pragma unroll
          for (int rw = 0; rw < SW; ++rw) {
            v[rw] = Cfg::post(fmaf(Cfg::pre(acc[k][rw][co]), ab.x, ab.y));
          }
        } else {
#pragma unroll
          for (int rw = 0; rw < SW; ++rw) v[rw] = Cfg::pre(acc[k][rw][co]);
        }
        convt_store_row<Cfg, Tune, kCoalesce>(yn + co * kPlane + row, v, q, lane);
      }
    }
  });
}

template <class Cfg, class Tune>
__device__ __forceinline__ void convt_norm_write(const ElemT<Cfg>* __restrict__ x,
                                                 const ElemT<Cfg>* __restrict__ weight,
                                                 const ElemT<Cfg>* __restrict__ bias,
                                                 const float2* __restrict__ scale_shift,
                                                 ElemT<Cfg>* __restrict__ y) {
  convt_static_checks<Cfg>();
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int C = Cfg::kC;
  constexpr size_t kPlane = T::kPlane;
  extern __shared__ __align__(16) float fj_convt_smem[];
  float* s_w = fj_convt_smem;
  convt_load_weights<Cfg, Tune>(weight, bias, s_w);
  const int n = blockIdx.y;
  const ElemT<Cfg>* __restrict__ xn = x + (size_t)n * Cfg::kCin * Cfg::kDin * Cfg::kHin * Cfg::kWin;
  __shared__ float2 s_ab[C];  // (scale, shift) of this sample's channels
  if (threadIdx.x < C) s_ab[threadIdx.x] = scale_shift[(size_t)n * C + threadIdx.x];
  __syncthreads();
  convt_write_units<Cfg, Tune, true>(xn, s_w, s_ab, y + (size_t)n * C * kPlane);
}

// The direct plan (conv_transpose3d | ew*, no group_norm): one pass, y = pre(conv_transpose3d +
// bias) written once. u, when not null (the training forward: codegen::SaveProducerOutput), also
// gets the convolution's output (f32, every element); a branch of its own.
template <class Cfg, class Tune>
__device__ __forceinline__ void convt_direct_write(const ElemT<Cfg>* __restrict__ x,
                                                   const ElemT<Cfg>* __restrict__ weight,
                                                   const ElemT<Cfg>* __restrict__ bias,
                                                   ElemT<Cfg>* __restrict__ y,
                                                   float* __restrict__ u) {
  convt_conv_checks<Cfg>();
  static_assert(Cfg::kGroups == 0 && Cfg::kMean == kNoMean,
                "convt_direct_write: elementwise ops only (all of them pre ops)");
  using T = ConvTGeom<Cfg, Tune>;
  constexpr size_t kSample = (size_t)Cfg::kC * T::kPlane;
  extern __shared__ __align__(16) float fj_convt_smem[];
  float* s_w = fj_convt_smem;
  convt_load_weights<Cfg, Tune>(weight, bias, s_w);
  __syncthreads();
  const int n = blockIdx.y;
  const ElemT<Cfg>* __restrict__ xn = x + (size_t)n * Cfg::kCin * Cfg::kDin * Cfg::kHin * Cfg::kWin;
  if (u != nullptr) {
    convt_write_units<Cfg, Tune, false, true>(xn, s_w, nullptr, y + n * kSample, u + n * kSample);
  } else {
    convt_write_units<Cfg, Tune, false>(xn, s_w, nullptr, y + n * kSample);
  }
}

// y = post(y * a_c + b_c) in place (after convt_group_moments<..., kStore = true>).
template <class Cfg, class Tune>
__device__ __forceinline__ void convt_apply_inplace(const float2* __restrict__ scale_shift,
                                                    float* __restrict__ y) {
  convt_static_checks<Cfg>();
  using T = ConvTGeom<Cfg, Tune>;
  constexpr int V = T::kApplyVec;
  const int row = blockIdx.y;  // n * C + c
  const float2 ab = scale_shift[row];
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i >= T::kPlane) return;
  float* p = y + (size_t)row * T::kPlane + i;
  if constexpr (V == 4) {
    float4 v = *reinterpret_cast<float4*>(p);
    v.x = Cfg::post(fmaf(v.x, ab.x, ab.y));
    v.y = Cfg::post(fmaf(v.y, ab.x, ab.y));
    v.z = Cfg::post(fmaf(v.z, ab.x, ab.y));
    v.w = Cfg::post(fmaf(v.w, ab.x, ab.y));
    *reinterpret_cast<float4*>(p) = v;
  } else {
    *p = Cfg::post(fmaf(*p, ab.x, ab.y));
  }
}

#ifndef FJ_GENERATED
// The default config is a conv3d chain; these kernels need a transposed one.
struct DefaultConvTConfig : DefaultConfig {
  static constexpr int kProducer = kConvTranspose3d;
  static constexpr int kCin = 3, kDin = 4, kHin = 5, kWin = 6;
  static constexpr int kC = 8, kD = 7, kH = 9, kW = 11;  // (in-1)*2 - 2*1 + 3
  static constexpr int kSD = 2, kSH = 2, kSW = 2;
  static constexpr int kPD = 1, kPH = 1, kPW = 1;
};
// The direct plan's chains have no group_norm.
struct DefaultConvTDirectConfig : DefaultConvTConfig {
  static constexpr int kGroups = 0;
};
#endif

}  // namespace fj

#ifndef FJ_GENERATED
// Compiled on its own (tests): instantiate with the default configuration.
using FjSelfTestCfg = fj::DefaultConvTConfig;
using FjSelfTestTune = fj::ConvTGroupNormTune;
extern "C" __global__ void __launch_bounds__(FjSelfTestTune::kThreads,
                                             FjSelfTestTune::kMinBlocksPerSM)
    convt_group_moments_selftest(const float* x, const float* w, const float* b, fj::Moments* p,
                                 float* u) {
  fj::convt_moments_body<FjSelfTestCfg, FjSelfTestTune>(x, w, b, p, u);
}
extern "C" __global__ void __launch_bounds__(32)
    group_norm_scale_shift_selftest(const fj::Moments* p, const float* g, const float* b, float2* s) {
  fj::group_norm_scale_shift<FjSelfTestCfg, FjSelfTestTune>(p, g, b, s);
}
extern "C" __global__ void __launch_bounds__(FjSelfTestTune::kThreads, FjSelfTestTune::kMinBlocksPerSM)
    convt_store_moments_selftest(const float* x, const float* w, const float* b, fj::Moments* p,
                                 float* y) {
  fj::convt_group_moments<FjSelfTestCfg, FjSelfTestTune, true>(x, w, b, p, y);
}
extern "C" __global__ void __launch_bounds__(256)
    convt_apply_inplace_selftest(const float2* s, float* y) {
  fj::convt_apply_inplace<FjSelfTestCfg, FjSelfTestTune>(s, y);
}
extern "C" __global__ void __launch_bounds__(FjSelfTestTune::kThreads,
                                             FjSelfTestTune::kMinBlocksPerSM)
    convt_direct_write_selftest(const float* x, const float* w, const float* b, float* y,
                                float* u) {
  fj::convt_direct_write<fj::DefaultConvTDirectConfig, FjSelfTestTune>(x, w, b, y, u);
}
extern "C" __global__ void __launch_bounds__(FjSelfTestTune::kThreads, FjSelfTestTune::kMinBlocksPerSM)
    convt_norm_write_selftest(const float* x, const float* w, const float* b, const float2* s, float* y) {
  fj::convt_norm_write<FjSelfTestCfg, FjSelfTestTune>(x, w, b, s, y);
}
#endif

#endif  // FUSEJIT_TEMPLATES_CONVT_GROUP_NORM_CUH_
