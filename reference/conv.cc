// reference/conv.cc: conv3d and conv_transpose3d for one sample, in double precision.
//
// Both loop over output rows (co, od, oh). A row starts as the bias; each input row that feeds it
// through a tap (ci, kd, kh, kw) adds w * input along w. Index ranges along w are precomputed per
// kw, so no inner loop tests bounds:
//   conv3d:                     out_row[o] += w * in_row[o * s + kw * dil - p]    (gather)
//   conv_transpose3d, s_w = 1:  out_row[o] += w * in_row[o + p - kw * dil]        (gather)
//   conv_transpose3d, s_w > 1:  out_row[i * s + kw * dil - p] += w * in_row[i]    (scatter)
// conv_transpose3d picks its input rows (id, ih) by gathering: output od receives input id through
// tap kd when od = id * s - p + kd * dil.
//
// Gathers go through AccumulateTaps, which keeps a block of outputs in registers across all the
// row's taps where every tap is in range (one load per multiply-add, one store per block), and
// handles the edges tap by tap. Each output value sums its terms in a fixed order, whatever the
// thread count or sample subset.
#include <algorithm>

#include "reference/ops.h"

namespace fusejit::reference_internal {
namespace {

// Floor and ceiling of a / b for b > 0 and any sign of a.
int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }

struct IndexRange {
  int64_t begin = 0, end = 0;  // [begin, end)
};

// The indices j in [0, count) for which j * stride + offset lies in [0, limit).
IndexRange ValidRange(int64_t offset, int64_t stride, int64_t limit, int64_t count) {
  IndexRange r;
  r.begin = std::max<int64_t>(0, CeilDiv(-offset, stride));
  r.end = std::min<int64_t>(count, FloorDiv(limit - 1 - offset, stride) + 1);
  r.end = std::max(r.end, r.begin);
  return r;
}

// One input row's contribution to an output row: out[o] += w * row[o * stride + offset] for the o
// in `range`, exactly those whose input index lies inside the row.
struct Tap {
  const double* row;
  double w;
  int64_t offset;
  IndexRange range;
};

// out[o] += w * row[o * stride + offset] for o in [begin, end).
void Axpy(double* __restrict out, const Tap& t, int64_t stride, int64_t begin, int64_t end) {
  for (int64_t o = begin; o < end; ++o) out[o] += t.w * t.row[o * stride + t.offset];
}

// For the outputs in [begin, end), where every tap is in range, sums all taps in registers, kBlock
// outputs at a time: one load per multiply-add and one store per block. Returns the first output
// not done (fewer than kBlock before end).
template <int64_t kStride, int64_t kBlock>
int64_t AccumulateBlocks(double* __restrict out, const std::vector<Tap>& taps, int64_t stride,
                         int64_t begin, int64_t end) {
  if constexpr (kStride != 0) stride = kStride;
  for (; begin + kBlock <= end; begin += kBlock) {
    double acc[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) acc[j] = out[begin + j];
    for (const Tap& t : taps) {
      const double* src = t.row + begin * stride + t.offset;
      for (int64_t j = 0; j < kBlock; ++j) acc[j] += t.w * src[j * stride];
    }
    for (int64_t j = 0; j < kBlock; ++j) out[begin + j] = acc[j];
  }
  return begin;
}

// Applies every tap to out. kStride is the stride when known at compile time (1), else 0.
template <int64_t kStride>
void AccumulateTaps(double* __restrict out, const std::vector<Tap>& taps, int64_t stride) {
  if (taps.empty()) return;
  if constexpr (kStride != 0) stride = kStride;
  // The interior [begin, end): outputs for which every tap is in range.
  int64_t begin = taps[0].range.begin, end = taps[0].range.end;
  for (const Tap& t : taps) {
    begin = std::max(begin, t.range.begin);
    end = std::min(end, t.range.end);
  }
  if (begin >= end) {  // no interior: each tap on its own
    for (const Tap& t : taps) Axpy(out, t, stride, t.range.begin, t.range.end);
    return;
  }
  int64_t done = AccumulateBlocks<kStride, 8>(out, taps, stride, begin, end);
  done = AccumulateBlocks<kStride, 4>(out, taps, stride, done, end);
  done = AccumulateBlocks<kStride, 2>(out, taps, stride, done, end);
  // The rest of each tap's range: before the interior, and after the last block.
  for (const Tap& t : taps) {
    Axpy(out, t, stride, t.range.begin, begin);
    Axpy(out, t, stride, done, t.range.end);
  }
}

void AccumulateTaps(double* out, const std::vector<Tap>& taps, int64_t stride) {
  if (stride == 1) {
    AccumulateTaps<1>(out, taps, 1);
  } else {
    AccumulateTaps<0>(out, taps, stride);
  }
}

// out[i * stride + offset] += w * in[i] for i in r.
void ScatterAxpy(double* __restrict out, const double* __restrict in, double w, IndexRange r,
                 int64_t stride, int64_t offset) {
  for (int64_t i = r.begin; i < r.end; ++i) out[i * stride + offset] += w * in[i];
}

// The input index that output index `o` reads through tap `k` of a transposed convolution along
// `dim`, or -1: o = i * stride - padding + k * dilation with 0 <= i < in_size.
int64_t TransposedSource(int64_t o, int64_t k, const ConvAttrs& a, int dim, int64_t in_size) {
  const int64_t t = o + a.padding[dim] - k * a.dilation[dim];
  if (t < 0 || t % a.stride[dim] != 0) return -1;
  const int64_t i = t / a.stride[dim];
  return i < in_size ? i : -1;
}

SampleTensor ZeroOutput(int64_t channels, const Dims3& dhw) {
  SampleTensor out;
  out.channels = channels;
  out.dhw = dhw;
  out.data.assign(static_cast<size_t>(channels * dhw[0] * dhw[1] * dhw[2]), 0.0);
  return out;
}

}  // namespace

SampleTensor Conv3d(const SampleTensor& in, const ConvAttrs& a, const float* weight,
                    const float* bias, const Dims3& out_dhw, int threads) {
  const int64_t cin = in.channels, cout = a.out_channels;
  // Not structured bindings: lambdas capture these (clang 14 cannot capture bindings).
  const int64_t D = in.dhw[0], H = in.dhw[1], W = in.dhw[2];
  const int64_t OD = out_dhw[0], OH = out_dhw[1], OW = out_dhw[2];
  const int64_t KD = a.kernel[0], KH = a.kernel[1], KW = a.kernel[2];
  SampleTensor out = ZeroOutput(cout, out_dhw);

  // For tap kw, output ow reads input column ow * s + kw * dil - p.
  std::vector<int64_t> w_offset(KW);
  std::vector<IndexRange> ow_range(KW);
  for (int64_t kw = 0; kw < KW; ++kw) {
    w_offset[kw] = kw * a.dilation[2] - a.padding[2];
    ow_range[kw] = ValidRange(w_offset[kw], a.stride[2], W, OW);
  }

  ParallelFor(cout, threads, [&](int64_t co_begin, int64_t co_end) {
    std::vector<Tap> taps;
    for (int64_t co = co_begin; co < co_end; ++co) {
      const float* w_co = weight + co * cin * KD * KH * KW;
      for (int64_t od = 0; od < OD; ++od) {
        for (int64_t oh = 0; oh < OH; ++oh) {
          double* out_row = &out.data[((co * OD + od) * OH + oh) * OW];
          std::fill(out_row, out_row + OW, bias ? static_cast<double>(bias[co]) : 0.0);
          for (int64_t ci = 0; ci < cin; ++ci) {
            taps.clear();
            for (int64_t kd = 0; kd < KD; ++kd) {
              const int64_t id = od * a.stride[0] - a.padding[0] + kd * a.dilation[0];
              if (id < 0 || id >= D) continue;
              for (int64_t kh = 0; kh < KH; ++kh) {
                const int64_t ih = oh * a.stride[1] - a.padding[1] + kh * a.dilation[1];
                if (ih < 0 || ih >= H) continue;
                const double* in_row = &in.data[((ci * D + id) * H + ih) * W];
                const float* w_row = w_co + ((ci * KD + kd) * KH + kh) * KW;
                for (int64_t kw = 0; kw < KW; ++kw) {
                  taps.push_back({in_row, w_row[kw], w_offset[kw], ow_range[kw]});
                }
              }
            }
            AccumulateTaps(out_row, taps, a.stride[2]);
          }
        }
      }
    }
  });
  return out;
}

SampleTensor ConvTranspose3d(const SampleTensor& in, const ConvAttrs& a, const float* weight,
                             const float* bias, const Dims3& out_dhw, int threads) {
  const int64_t cin = in.channels, cout = a.out_channels;
  // Not structured bindings: lambdas capture these (clang 14 cannot capture bindings).
  const int64_t D = in.dhw[0], H = in.dhw[1], W = in.dhw[2];
  const int64_t OD = out_dhw[0], OH = out_dhw[1], OW = out_dhw[2];
  const int64_t KD = a.kernel[0], KH = a.kernel[1], KW = a.kernel[2];
  SampleTensor out = ZeroOutput(cout, out_dhw);

  // With stride 1 along w, output ow reads input column ow + p - kw * dil (a gather); otherwise
  // input column iw writes output column iw * s + kw * dil - p (a scatter).
  const bool gather_w = a.stride[2] == 1;
  std::vector<int64_t> w_offset(KW);
  std::vector<IndexRange> w_range(KW);
  for (int64_t kw = 0; kw < KW; ++kw) {
    if (gather_w) {
      w_offset[kw] = a.padding[2] - kw * a.dilation[2];
      w_range[kw] = ValidRange(w_offset[kw], 1, W, OW);
    } else {
      w_offset[kw] = kw * a.dilation[2] - a.padding[2];
      w_range[kw] = ValidRange(w_offset[kw], a.stride[2], OW, W);
    }
  }

  ParallelFor(cout, threads, [&](int64_t co_begin, int64_t co_end) {
    std::vector<Tap> taps;
    for (int64_t co = co_begin; co < co_end; ++co) {
      for (int64_t od = 0; od < OD; ++od) {
        for (int64_t oh = 0; oh < OH; ++oh) {
          double* out_row = &out.data[((co * OD + od) * OH + oh) * OW];
          std::fill(out_row, out_row + OW, bias ? static_cast<double>(bias[co]) : 0.0);
          for (int64_t ci = 0; ci < cin; ++ci) {
            taps.clear();
            const float* w_cico = weight + (ci * cout + co) * KD * KH * KW;
            for (int64_t kd = 0; kd < KD; ++kd) {
              const int64_t id = TransposedSource(od, kd, a, 0, D);
              if (id < 0) continue;
              for (int64_t kh = 0; kh < KH; ++kh) {
                const int64_t ih = TransposedSource(oh, kh, a, 1, H);
                if (ih < 0) continue;
                const double* in_row = &in.data[((ci * D + id) * H + ih) * W];
                const float* w_row = w_cico + (kd * KH + kh) * KW;
                for (int64_t kw = 0; kw < KW; ++kw) {
                  if (gather_w) {
                    taps.push_back({in_row, w_row[kw], w_offset[kw], w_range[kw]});
                  } else {
                    ScatterAxpy(out_row, in_row, w_row[kw], w_range[kw], a.stride[2], w_offset[kw]);
                  }
                }
              }
            }
            AccumulateTaps(out_row, taps, 1);
          }
        }
      }
    }
  });
  return out;
}

}  // namespace fusejit::reference_internal
