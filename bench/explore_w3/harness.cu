// bench/explore_w3/harness.cu: standalone correctness + timing harness for seed workload W3
//   x [16,64,32,32,32] -> conv_transpose3d(64->128, k=3, bias=false) -> relu
//   -> group_norm(8 groups, eps 1e-5, affine) -> y [16,128,34,34,34]
// with the kernels of templates/igemm_mma.cuh + templates/gn_apply.cuh, several tunings and
// both precision modes. Checks against a float64 CPU reference (samples 0 and N-1), that every
// output is written (NaN poison), and that two runs are bitwise identical; times with CUDA
// events (warm-up, L2 flushed by a 256 MB memset before every rep, median).
// Small extra configs (conv3d with padding/dilation/bias, conv_transpose3d with padding and
// odd sizes) are checked in full against the CPU reference.
//
// Build (here, no GPU needed):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I/work/main/templates -cudart static \
//        -o bench/explore_w3/bin/harness bench/explore_w3/harness.cu -lpthread
// Run (device): bench/explore_w3/bin/harness [--reps N] [--only SUBSTR] [--no-small]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "default_config.cuh"
#include "gn_apply.cuh"
#include "igemm_mma.cuh"
#include "igemm_wgmma.cuh"

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, \
              __LINE__, #x);                                                           \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

// ---------------------------------------------------------------- configs (as generated)
struct W3Cfg : fj::DefaultConfig {
  static constexpr int kN = 16;
  static constexpr int kCin = 64, kDin = 32, kHin = 32, kWin = 32;
  static constexpr int kC = 128, kD = 34, kH = 34, kW = 34;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kKD = 3, kKH = 3, kKW = 3;
  static constexpr int kSD = 1, kSH = 1, kSW = 1;
  static constexpr int kPD = 0, kPH = 0, kPW = 0;
  static constexpr int kDilD = 1, kDilH = 1, kDilW = 1;
  static constexpr bool kBias = false;
  static constexpr int kGroups = 8;
  static constexpr float kEps = 1e-5f;
  static constexpr int kMean = fj::kNoMean;
  __device__ static float pre(float v) { return fj::relu(v); }
  __device__ static float post(float v) { return v; }
};
// conv3d, padding 1, dilation 2, bias, odd sizes.
struct S1Cfg : fj::DefaultConfig {
  static constexpr int kN = 2;
  static constexpr int kCin = 32, kDin = 9, kHin = 10, kWin = 11;
  static constexpr int kC = 64, kD = 7, kH = 8, kW = 9;
  static constexpr int kProducer = fj::kConv3d;
  static constexpr int kKD = 3, kKH = 3, kKW = 3;
  static constexpr int kSD = 1, kSH = 1, kSW = 1;
  static constexpr int kPD = 1, kPH = 1, kPW = 1;
  static constexpr int kDilD = 2, kDilH = 2, kDilW = 2;
  static constexpr bool kBias = true;
  static constexpr int kGroups = 4;
  static constexpr float kEps = 1e-5f;
  static constexpr int kMean = fj::kNoMean;
  __device__ static float pre(float v) { return fj::relu(v); }
  __device__ static float post(float v) { return v; }
};
// conv_transpose3d, padding (1,0,1), kernel (3,2,3), 64 -> 32 channels, S % 4 != 0.
struct S2Cfg : fj::DefaultConfig {
  static constexpr int kN = 3;
  static constexpr int kCin = 64, kDin = 5, kHin = 6, kWin = 7;
  static constexpr int kC = 32, kD = 5, kH = 7, kW = 7;
  static constexpr int kProducer = fj::kConvTranspose3d;
  static constexpr int kKD = 3, kKH = 2, kKW = 3;
  static constexpr int kSD = 1, kSH = 1, kSW = 1;
  static constexpr int kPD = 1, kPH = 0, kPW = 1;
  static constexpr int kDilD = 1, kDilH = 1, kDilW = 1;
  static constexpr bool kBias = false;
  static constexpr int kGroups = 2;
  static constexpr float kEps = 1e-5f;
  static constexpr int kMean = fj::kNoMean;
  __device__ static float pre(float v) { return fj::relu(v); }
  __device__ static float post(float v) { return v; }
};

// The same with 128 output channels (the wgmma kernel's tile width).
struct S3Cfg : S1Cfg {
  static constexpr int kC = 128;
};
struct S4Cfg : S2Cfg {
  static constexpr int kC = 128;
  static constexpr int kHin = 8, kWin = 9, kH = 9, kW = 9;  // H*W >= 64 (one warpgroup tile)
};

// ---------------------------------------------------------------- tunings
template <int P, int WMs, int WNs, int WM, int WN, int ST, int FL, int HALO = 1, int MR = 224>
struct Tn {
  static constexpr int kMaxRegs = MR;
  static constexpr int kHalo = HALO;  // harness only: 1 = igemm_halo_kernel, 0 = igemm_mma_kernel
  static constexpr int kPrec = P;
  static constexpr int kWarpsM = WMs, kWarpsN = WNs, kWM = WM, kWN = WN;
  static constexpr int kStages = ST;
  static constexpr int kFlushSteps = FL;
  static constexpr int kAbsmaxBlocks = 264;
};

// wgmma tunings (harness kernel selector kHalo = 2).
template <int P, int WG, int ST, int FL, int AS = 0>
struct TW : fj::IgemmWgmmaTune<P, WG, ST, FL> {
  static constexpr int kHalo = 2;
  static constexpr int kAsync = AS;
};

// ---------------------------------------------------------------- host data + reference
template <class Cfg>
struct HostData {
  static constexpr long long kSin = (long long)Cfg::kDin * Cfg::kHin * Cfg::kWin;
  static constexpr long long kS = (long long)Cfg::kD * Cfg::kH * Cfg::kW;
  static constexpr int kTaps = Cfg::kKD * Cfg::kKH * Cfg::kKW;
  std::vector<float> x, w, b, gamma, beta;
  explicit HostData(unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u01(0.f, 1.f);
    x.resize((size_t)Cfg::kN * Cfg::kCin * kSin);
    for (auto& v : x) v = u01(rng);
    const bool tr = Cfg::kProducer == fj::kConvTranspose3d;
    // PyTorch: fan_in = weight.size(1) * receptive field.
    const double fan_in = (double)(tr ? Cfg::kC : Cfg::kCin) * kTaps;
    const float bound = (float)(1.0 / std::sqrt(fan_in));
    std::uniform_real_distribution<float> uw(-bound, bound);
    w.resize((size_t)Cfg::kC * Cfg::kCin * kTaps);
    for (auto& v : w) v = uw(rng);
    b.resize(Cfg::kC);
    for (auto& v : b) v = uw(rng);
    std::uniform_real_distribution<float> ug(0.5f, 1.5f), ub(-0.5f, 0.5f);
    gamma.resize(Cfg::kC);
    beta.resize(Cfg::kC);
    for (auto& v : gamma) v = ug(rng);
    for (auto& v : beta) v = ub(rng);
  }
  // float64 reference of the whole chain for sample n -> out [C][S].
  void reference(int n, std::vector<double>& out, std::vector<double>* prenorm = nullptr) const {
    const bool tr = Cfg::kProducer == fj::kConvTranspose3d;
    const int bD = tr ? Cfg::kPD : -Cfg::kPD, bH = tr ? Cfg::kPH : -Cfg::kPH,
              bW = tr ? Cfg::kPW : -Cfg::kPW;
    const int sD = tr ? -Cfg::kDilD : Cfg::kDilD, sH = tr ? -Cfg::kDilH : Cfg::kDilH,
              sW = tr ? -Cfg::kDilW : Cfg::kDilW;
    out.assign((size_t)Cfg::kC * kS, 0.0);
    const float* xs = x.data() + (size_t)n * Cfg::kCin * kSin;
    unsigned nth = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nth; ++t) {
      th.emplace_back([&, t]() {
        std::vector<double> xr(Cfg::kWin);
        for (int co = t; co < Cfg::kC; co += nth) {
          double* o = out.data() + (size_t)co * kS;
          for (int ci = 0; ci < Cfg::kCin; ++ci)
            for (int kd = 0; kd < Cfg::kKD; ++kd)
              for (int kh = 0; kh < Cfg::kKH; ++kh)
                for (int kw = 0; kw < Cfg::kKW; ++kw) {
                  const int tap = (kd * Cfg::kKH + kh) * Cfg::kKW + kw;
                  const double wv =
                      tr ? w[((size_t)ci * Cfg::kC + co) * kTaps + tap]
                         : w[((size_t)co * Cfg::kCin + ci) * kTaps + tap];
                  const int offw = bW + kw * sW;  // iw = ow + offw
                  const int ow0 = std::max(0, -offw), ow1 = std::min(Cfg::kW, Cfg::kWin - offw);
                  for (int od = 0; od < Cfg::kD; ++od) {
                    const int id = od + bD + kd * sD;
                    if (id < 0 || id >= Cfg::kDin) continue;
                    for (int oh = 0; oh < Cfg::kH; ++oh) {
                      const int ih = oh + bH + kh * sH;
                      if (ih < 0 || ih >= Cfg::kHin) continue;
                      const float* xrow = xs + (size_t)ci * kSin + ((size_t)id * Cfg::kHin + ih) * Cfg::kWin;
                      double* orow = o + ((size_t)od * Cfg::kH + oh) * Cfg::kW;
                      for (int ow = ow0; ow < ow1; ++ow) orow[ow] += wv * (double)xrow[ow + offw];
                    }
                  }
                }
        }
      });
    }
    for (auto& t : th) t.join();
    // bias, relu, group norm (biased variance), affine, identity post.
    const int cg = Cfg::kC / Cfg::kGroups;
    for (int c = 0; c < Cfg::kC; ++c)
      for (long long s = 0; s < kS; ++s) {
        double v = out[(size_t)c * kS + s] + (Cfg::kBias ? (double)b[c] : 0.0);
        out[(size_t)c * kS + s] = v > 0 ? v : 0;
      }
    if (prenorm) *prenorm = out;
    for (int g = 0; g < Cfg::kGroups; ++g) {
      double sum = 0, sq = 0;
      const size_t cnt = (size_t)cg * kS;
      const double* p = out.data() + (size_t)g * cg * kS;
      for (size_t i = 0; i < cnt; ++i) sum += p[i];
      const double mean = sum / cnt;
      for (size_t i = 0; i < cnt; ++i) sq += (p[i] - mean) * (p[i] - mean);
      const double rstd = 1.0 / std::sqrt(sq / cnt + (double)Cfg::kEps);
      for (int c = g * cg; c < (g + 1) * cg; ++c)
        for (long long s = 0; s < kS; ++s) {
          double& v = out[(size_t)c * kS + s];
          v = (v - mean) * rstd * gamma[c] + beta[c];
        }
    }
  }
};

// ---------------------------------------------------------------- device pipeline
template <class Cfg, class Tune>
struct Pipeline {
  using Sh = fj::IgemmShape<Cfg, Tune>;
  static constexpr bool kF16 = Tune::kPrec == fj::kPrecF16x3;
  static constexpr int kMaxChunks = 16;
  float *x, *w, *b, *gamma, *beta;  // inputs (not owned)
  float* y;                         // output (not owned)
  unsigned char *xa, *wb;
  float *absmax, *scale, *partials, *stats;
  int chunks;  // 1: one launch per kernel on one stream; > 1: samples in chunks, overlapped
  cudaStream_t sm, sp, sg[2], spost;
  cudaEvent_t ep[kMaxChunks], eg[kMaxChunks], ein, eout;
  Pipeline(float* x_, float* w_, float* b_, float* g_, float* be_, float* y_, int chunks_)
      : x(x_), w(w_), b(b_), gamma(g_), beta(be_), y(y_), chunks(chunks_) {
    CK(cudaMalloc(&xa, Sh::kXaBytes));
    CK(cudaMalloc(&wb, Sh::kWbBytes));
    CK(cudaMalloc(&absmax, kMaxChunks * 2 * Tune::kAbsmaxBlocks * sizeof(float)));
    CK(cudaMalloc(&scale, kMaxChunks * sizeof(float)));
    CK(cudaMalloc(&partials, Sh::kPartialFloats * sizeof(float)));
    CK(cudaMalloc(&stats, 2 * Cfg::kN * Cfg::kGroups * sizeof(float)));
    if constexpr (Tune::kHalo == 2)
      CK(cudaFuncSetAttribute(fj::igemm_wgmma_kernel<Cfg, Tune>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              fj::IgemmWgmmaShape<Cfg, Tune>::kSmemBytes));
    else if constexpr (Tune::kHalo)
      CK(cudaFuncSetAttribute(fj::igemm_halo_kernel<Cfg, Tune>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              fj::HaloShape<Cfg, Tune>::kSmemBytes));
    else
      CK(cudaFuncSetAttribute(fj::igemm_mma_kernel<Cfg, Tune>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSmemBytes));
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithFlags(&sm, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&sp, cudaStreamNonBlocking, lo));
    CK(cudaStreamCreateWithPriority(&spost, cudaStreamNonBlocking, lo));
    for (auto& st : sg) CK(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, hi));
    for (int c = 0; c < kMaxChunks; ++c) {
      CK(cudaEventCreateWithFlags(&ep[c], cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&eg[c], cudaEventDisableTiming));
    }
    CK(cudaEventCreateWithFlags(&ein, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&eout, cudaEventDisableTiming));
  }
  ~Pipeline() {
    cudaDeviceSynchronize();
    cudaFree(xa); cudaFree(wb); cudaFree(absmax); cudaFree(scale); cudaFree(partials);
    cudaFree(stats);
    cudaStreamDestroy(sm); cudaStreamDestroy(sp); cudaStreamDestroy(spost);
    for (auto& st : sg) cudaStreamDestroy(st);
    for (int c = 0; c < kMaxChunks; ++c) { cudaEventDestroy(ep[c]); cudaEventDestroy(eg[c]); }
    cudaEventDestroy(ein); cudaEventDestroy(eout);
  }
  // Samples [n0, n0+ns) of chunk c.
  void prep(cudaStream_t st, int c, int n0, int ns, bool weights) {
    float* am = absmax + c * 2 * Tune::kAbsmaxBlocks;
    const float* xc = x + (long long)n0 * Cfg::kCin * Sh::kSin;
    if constexpr (kF16) {
      fj::igemm_absmax_kernel<Cfg, Tune><<<Tune::kAbsmaxBlocks, 256, 0, st>>>(xc, w, am, ns);
      CK(cudaGetLastError());
    }
    fj::igemm_prep_kernel<Cfg, Tune>
        <<<ns * Sh::kPrepXBlocksPerSample + (weights ? Sh::kPrepWBlocks : 0), 256, 0, st>>>(
            xc, w, am, xa + (long long)n0 * Sh::kSin * Sh::kRowBytes, wb, scale + c, ns);
    CK(cudaGetLastError());
  }
  void gemm(cudaStream_t st, int c, int n0, int ns) {
    dim3 grid(Sh::kTiles, Cfg::kC / Sh::kBN, ns);
    const unsigned char* xc = xa + (long long)n0 * Sh::kSin * Sh::kRowBytes;
    float* yc = y + (long long)n0 * Cfg::kC * Sh::kS;
    float* pc = partials + (long long)n0 * Cfg::kGroups * Sh::kTiles * 3;
    if constexpr (Tune::kHalo == 2)
      fj::igemm_wgmma_kernel<Cfg, Tune>
          <<<grid, Sh::kThreads, fj::IgemmWgmmaShape<Cfg, Tune>::kSmemBytes, st>>>(
              xc, wb, b, scale + c, yc, pc);
    else if constexpr (Tune::kHalo)
      fj::igemm_halo_kernel<Cfg, Tune>
          <<<grid, Sh::kThreads, fj::HaloShape<Cfg, Tune>::kSmemBytes, st>>>(xc, wb, b, scale + c,
                                                                              yc, pc);
    else
      fj::igemm_mma_kernel<Cfg, Tune>
          <<<grid, Sh::kThreads, Sh::kSmemBytes, st>>>(xc, wb, b, scale + c, yc, pc);
    CK(cudaGetLastError());
  }
  void post(cudaStream_t st, int n0, int ns) {
    fj::gn_finalize_kernel<Cfg, Sh::kTiles><<<ns * Cfg::kGroups, 256, 0, st>>>(
        partials + (long long)n0 * Cfg::kGroups * Sh::kTiles * 3, stats + n0 * Cfg::kGroups * 2);
    CK(cudaGetLastError());
    using A = fj::GnApply<Cfg>;
    fj::gn_apply_kernel<Cfg><<<dim3(A::kBlocksPerRow, ns * Cfg::kC), A::kThreads, 0, st>>>(
        gamma, beta, stats + n0 * Cfg::kGroups * 2, y + (long long)n0 * Cfg::kC * Sh::kS);
    CK(cudaGetLastError());
  }
  // ev: 5 timing events (start, after prep, after gemm, after finalize, end) or nullptr;
  // with chunks > 1 only ev[0] and ev[4] are meaningful (the stages overlap).
  void run(cudaEvent_t* ev, bool stop_after_gemm = false) {
    if (ev) CK(cudaEventRecord(ev[0], sm));
    if (chunks <= 1 || stop_after_gemm) {
      prep(sm, 0, 0, Cfg::kN, true);
      if (ev) CK(cudaEventRecord(ev[1], sm));
      gemm(sm, 0, 0, Cfg::kN);
      if (ev) CK(cudaEventRecord(ev[2], sm));
      if (stop_after_gemm) return;
      post(sm, 0, Cfg::kN);
      if (ev) CK(cudaEventRecord(ev[3], sm));
      if (ev) CK(cudaEventRecord(ev[4], sm));
      return;
    }
    CK(cudaEventRecord(ein, sm));
    CK(cudaStreamWaitEvent(sp, ein));
    CK(cudaStreamWaitEvent(sg[0], ein));
    CK(cudaStreamWaitEvent(sg[1], ein));
    CK(cudaStreamWaitEvent(spost, ein));
    const int per = (Cfg::kN + chunks - 1) / chunks;
    auto range = [&](int c, int* n0, int* ns) {
      *n0 = c * per;
      *ns = std::min(per, Cfg::kN - *n0);
    };
    // Enqueue order: prep(c), gemm(c), post(c-1), ...
    for (int c = 0; c <= chunks; ++c) {
      int n0, ns;
      if (c < chunks) {
        range(c, &n0, &ns);
        prep(sp, c, n0, ns, c == 0);
        CK(cudaEventRecord(ep[c], sp));
        cudaStream_t g = sg[c & 1];
        CK(cudaStreamWaitEvent(g, ep[c]));
        gemm(g, c, n0, ns);
        CK(cudaEventRecord(eg[c], g));
      }
      if (c > 0) {
        range(c - 1, &n0, &ns);
        CK(cudaStreamWaitEvent(spost, eg[c - 1]));
        post(spost, n0, ns);
      }
    }
    CK(cudaEventRecord(eout, spost));
    CK(cudaStreamWaitEvent(sm, eout));
    if (ev) CK(cudaEventRecord(ev[4], sm));
  }
};

// ---------------------------------------------------------------- one variant
struct Row {
  std::string name, mode;
  double ms = NAN, ms_prep = NAN, ms_gemm = NAN, ms_fin = NAN, ms_apply = NAN;
  double rel = NAN, maxabs = NAN, rel_pre = NAN;
  long long nonfinite = -1;
  bool identical = false;
  double target = 0;
};

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

template <class Cfg>
struct Bench {
  HostData<Cfg> h;
  std::vector<int> samples;
  std::vector<std::vector<double>> refs, pres;
  float *x, *w, *b, *gamma, *beta, *y;
  size_t ny;
  Bench(unsigned seed, std::vector<int> smp) : h(seed), samples(smp) {
    ny = (size_t)Cfg::kN * Cfg::kC * HostData<Cfg>::kS;
    auto up = [](const std::vector<float>& v, float** d) {
      CK(cudaMalloc(d, v.size() * sizeof(float)));
      CK(cudaMemcpy(*d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    };
    up(h.x, &x);
    up(h.w, &w);
    up(h.b, &b);
    up(h.gamma, &gamma);
    up(h.beta, &beta);
    CK(cudaMalloc(&y, ny * sizeof(float)));
    refs.resize(samples.size());
    pres.resize(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) h.reference(samples[i], refs[i], &pres[i]);
  }
  ~Bench() {
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(gamma); cudaFree(beta); cudaFree(y);
  }
  void poison() {  // 0xFFFFFFFF = NaN
    CK(cudaMemset(y, 0xFF, ny * sizeof(float)));
    CK(cudaDeviceSynchronize());
  }

  template <class Tune>
  Row run(const char* name, const char* mode, double target, int reps, void* flush,
          size_t flush_bytes, int chunks = 1) {
    Row r;
    r.name = name;
    r.mode = mode;
    r.target = target;
    Pipeline<Cfg, Tune> p(x, w, b, gamma, beta, y, chunks);
    std::vector<float> out1(ny), out2(ny);
    poison();
    p.run(nullptr);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaMemcpy(out1.data(), y, ny * sizeof(float), cudaMemcpyDeviceToHost));
    poison();
    p.run(nullptr);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out2.data(), y, ny * sizeof(float), cudaMemcpyDeviceToHost));
    r.identical = memcmp(out1.data(), out2.data(), ny * sizeof(float)) == 0;
    r.nonfinite = 0;
    for (size_t i = 0; i < ny; ++i) r.nonfinite += !std::isfinite(out1[i]);
    double e2 = 0, r2 = 0, mx = 0;
    const size_t per = (size_t)Cfg::kC * HostData<Cfg>::kS;
    for (size_t si = 0; si < samples.size(); ++si) {
      const float* o = out1.data() + (size_t)samples[si] * per;
      const std::vector<double>& ref = refs[si];
      for (size_t i = 0; i < per; ++i) {
        const double d = (double)o[i] - ref[i];
        e2 += d * d;
        r2 += ref[i] * ref[i];
        mx = std::max(mx, std::fabs(d));
        if (std::isnan(d)) mx = INFINITY;
      }
    }
    r.rel = std::sqrt(e2 / r2);
    r.maxabs = mx;
    // Pre-norm values (after the GEMM kernel alone) against the float64 conv + relu.
    poison();
    p.run(nullptr, true);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(out2.data(), y, ny * sizeof(float), cudaMemcpyDeviceToHost));
    e2 = 0;
    r2 = 0;
    for (size_t si = 0; si < samples.size(); ++si) {
      const float* o = out2.data() + (size_t)samples[si] * per;
      for (size_t i = 0; i < per; ++i) {
        const double d = (double)o[i] - pres[si][i];
        e2 += d * d;
        r2 += pres[si][i] * pres[si][i];
      }
    }
    r.rel_pre = std::sqrt(e2 / r2);
    if (reps > 0) {
      cudaEvent_t ev[5];
      for (auto& e : ev) CK(cudaEventCreate(&e));
      for (int i = 0; i < 3; ++i) p.run(nullptr);
      std::vector<double> t, tp, tg, tf, ta;
      for (int i = 0; i < reps; ++i) {
        CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, p.sm));
        p.run(ev);
        CK(cudaEventSynchronize(ev[4]));
        float a = 0, b1 = 0, c = 0, d = 0, e = 0;
        CK(cudaEventElapsedTime(&a, ev[0], ev[4]));
        if (chunks <= 1) {
          CK(cudaEventElapsedTime(&b1, ev[0], ev[1]));
          CK(cudaEventElapsedTime(&c, ev[1], ev[2]));
          CK(cudaEventElapsedTime(&d, ev[2], ev[4]));
        }
        t.push_back(a); tp.push_back(b1); tg.push_back(c); tf.push_back(d); ta.push_back(e);
      }
      r.ms = median(t);
      if (chunks <= 1) {
        r.ms_prep = median(tp); r.ms_gemm = median(tg); r.ms_fin = median(tf);
        r.ms_apply = median(ta);
      }
      for (auto& e : ev) CK(cudaEventDestroy(e));
    }
    printf("  %-34s %-5s ms %8.4f (prep %.4f gemm %.4f fin %.4f apply %.4f)  rel %.3e  max %.3e  "
           "rel_prenorm %.3e  nonfinite %lld  identical %d\n",
           name, mode, r.ms, r.ms_prep, r.ms_gemm, r.ms_fin, r.ms_apply, r.rel, r.maxabs,
           r.rel_pre, r.nonfinite, (int)r.identical);
    fflush(stdout);
    return r;
  }
};

int main(int argc, char** argv) {
  int reps = 20;
  std::string only;
  bool small = true;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--no-small")) small = false;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, L2 %d MB, smem/block optin %zu KB\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin >> 10);
  const size_t flush_bytes = 256ull << 20;
  void* flush;
  CK(cudaMalloc(&flush, flush_bytes));
  std::vector<Row> rows;
  // --only: comma-separated substrings; a variant runs when its name contains any of them.
  auto want = [&](const char* n) {
    if (only.empty()) return true;
    size_t b = 0;
    while (b <= only.size()) {
      size_t e = only.find(',', b);
      if (e == std::string::npos) e = only.size();
      if (e > b && strstr(n, only.substr(b, e - b).c_str())) return true;
      b = e + 1;
    }
    return false;
  };

  auto run_small = [&]() {
    if (!small) return;
    printf("small configs (all samples vs float64):\n");
    {
      Bench<S1Cfg> bs(7, {0, 1});
      using T1 = Tn<fj::kPrecF16x3, 2, 2, 32, 32, 3, 2>;
      using T2 = Tn<fj::kPrecTF32x1, 2, 2, 32, 32, 3, 0>;
      using T3 = Tn<fj::kPrecTF32x3, 2, 2, 32, 32, 3, 1>;
      using T4 = Tn<fj::kPrecF16x3, 2, 2, 32, 32, 3, 2, 0>;
      rows.push_back(bs.run<T1>("S1 conv3d p1 d2 bias f16x3 halo", "fp32", 0, 0, flush, flush_bytes));
      rows.push_back(bs.run<T2>("S1 conv3d p1 d2 bias tf32 halo", "tf32", 0, 0, flush, flush_bytes));
      rows.push_back(bs.run<T3>("S1 conv3d p1 d2 bias tf32x3 halo", "fp32", 0, 0, flush, flush_bytes));
      rows.push_back(bs.run<T4>("S1 conv3d p1 d2 bias f16x3 im2col", "fp32", 0, 0, flush, flush_bytes));
    }
    {
      Bench<S2Cfg> bs(8, {0, 1, 2});
      using T1 = Tn<fj::kPrecF16x3, 1, 2, 32, 16, 2, 2>;
      using T2 = Tn<fj::kPrecTF32x1, 2, 1, 16, 32, 4, 0>;
      using T3 = Tn<fj::kPrecF16x3, 1, 2, 32, 16, 2, 2, 0>;
      rows.push_back(bs.run<T1>("S2 convT k323 p101 f16x3 halo", "fp32", 0, 0, flush, flush_bytes));
      rows.push_back(bs.run<T2>("S2 convT k323 p101 tf32 halo", "tf32", 0, 0, flush, flush_bytes));
      rows.push_back(bs.run<T3>("S2 convT k323 p101 f16x3 im2col", "fp32", 0, 0, flush, flush_bytes));
    }
    {
      Bench<S3Cfg> bs(9, {0, 1});
      rows.push_back(bs.run<TW<fj::kPrecF16x3, 1, 3, 2>>("S3 conv3d C128 f16x3 wgmma", "fp32", 0, 0,
                                                         flush, flush_bytes));
      rows.push_back(bs.run<TW<fj::kPrecTF32x1, 1, 3, 0>>("S3 conv3d C128 tf32 wgmma", "tf32", 0, 0,
                                                          flush, flush_bytes));
    }
    {
      Bench<S4Cfg> bs(10, {0, 1, 2});
      rows.push_back(bs.run<TW<fj::kPrecF16x3, 1, 3, 1>>("S4 convT C128 f16x3 wgmma", "fp32", 0, 0,
                                                         flush, flush_bytes));
      rows.push_back(bs.run<TW<fj::kPrecTF32x1, 1, 4, 0>>("S4 convT C128 tf32 wgmma", "tf32", 0, 0,
                                                          flush, flush_bytes));
      rows.push_back(bs.run<TW<fj::kPrecF16x3, 1, 4, 2, 1>>("S4 convT C128 f16x3 wgmma async", "fp32",
                                                            0, 0, flush, flush_bytes));
      rows.push_back(bs.run<TW<fj::kPrecTF32x1, 1, 4, 0, 1>>("S4 convT C128 tf32 wgmma async", "tf32",
                                                             0, 0, flush, flush_bytes));
    }
  };

  printf("W3 (samples 0 and 15 vs float64; reference takes a few seconds)...\n");
  fflush(stdout);
  {
    Bench<W3Cfg> bw(2026, {0, W3Cfg::kN - 1});
    // name: precision, warps MxN, warp tile, stages, flush
#define V(P, WMs, WNs, WM, WN, ST, FL, HALO, CH, NAME, MODE, TGT)                        \
  if (want(NAME))                                                                         \
    rows.push_back(bw.run<Tn<P, WMs, WNs, WM, WN, ST, FL, HALO>>(NAME, MODE, TGT, reps, flush, \
                                                                flush_bytes, CH));
#define VW(P, WG, ST, FL, AS, CH, NAME, MODE, TGT)                                             \
  if (want(NAME))                                                                          \
    rows.push_back(bw.run<TW<P, WG, ST, FL, AS>>(NAME, MODE, TGT, reps, flush, flush_bytes, CH));
    run_small();
    VW(fj::kPrecF16x3, 3, 7, 2, 1, 1, "wgmma f16x3 192 s7 fl2 async", "fp32", 2.0)
    VW(fj::kPrecF16x3, 3, 7, 3, 1, 1, "wgmma f16x3 192 s7 fl3 async", "fp32", 2.0)
    VW(fj::kPrecF16x3, 3, 6, 2, 1, 1, "wgmma f16x3 192 s6 fl2 async", "fp32", 2.0)
    VW(fj::kPrecTF32x1, 4, 4, 0, 0, 8, "wgmma tf32 256 s4 ovl8", "tf32", 1.0)
    VW(fj::kPrecTF32x1, 4, 4, 0, 1, 8, "wgmma tf32 256 s4 async ovl8", "tf32", 1.0)
    VW(fj::kPrecTF32x1, 4, 5, 0, 1, 8, "wgmma tf32 256 s5 async ovl8", "tf32", 1.0)
#undef VW
#undef V
  }

  printf("\n%-34s %-5s %8s %7s %7s %6s %6s %9s %9s %9s %6s %5s %6s\n", "variant", "mode", "ms",
         "prep", "gemm", "fin", "apply", "rel_l2", "max_abs", "rel_pre", "nonfin", "ident",
         "target");
  for (const Row& r : rows)
    printf("%-34s %-5s %8.4f %7.4f %7.4f %6.4f %6.4f %9.2e %9.2e %9.2e %6lld %5d %6.2f\n",
           r.name.c_str(), r.mode.c_str(), r.ms, r.ms_prep, r.ms_gemm, r.ms_fin, r.ms_apply,
           r.rel, r.maxabs, r.rel_pre, r.nonfinite, (int)r.identical, r.target);
  cudaFree(flush);
  return 0;
}
