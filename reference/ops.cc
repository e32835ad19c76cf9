// reference/ops.cc: elementwise ops, GroupNorm, mean and the thread helper of the CPU reference.
#include "reference/ops.h"

#include <algorithm>
#include <cmath>
#include <system_error>
#include <thread>

#include "codegen/op_table.h"

namespace fusejit::reference_internal {

void ParallelFor(int64_t count, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  const int64_t workers = std::clamp<int64_t>(threads, 1, count);
  if (workers == 1) {
    fn(0, count);
    return;
  }
  // Worker t takes [count * t / workers, count * (t + 1) / workers); the caller runs chunk 0, and
  // any chunk whose thread cannot be started (nothing throws out of here).
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int64_t t = 1; t < workers; ++t) {
    const int64_t begin = count * t / workers, end = count * (t + 1) / workers;
    try {
      pool.emplace_back(fn, begin, end);
    } catch (const std::system_error&) {
      fn(begin, end);
    }
  }
  fn(0, count / workers);
  for (std::thread& th : pool) th.join();
}

double Elementwise(const Op& op, double x) {
  const OpDesc& d = Describe(op.kind);
  return d.value != nullptr ? d.value(op, x) : x;  // not elementwise: validated chains never ask
}

void ElementwiseInPlace(const Op& op, SampleTensor& t) {
  for (double& v : t.data) v = Elementwise(op, v);
}

void GroupNormInPlace(SampleTensor& t, int64_t groups, double eps, const float* gamma,
                      const float* beta) {
  const int64_t channels_per_group = t.channels / groups;
  const int64_t spatial = t.Spatial();
  const int64_t group_size = channels_per_group * spatial;
  for (int64_t g = 0; g < groups; ++g) {
    double* x = &t.data[g * group_size];
    // Two passes: the mean, then the biased variance about it.
    double sum = 0;
    for (int64_t i = 0; i < group_size; ++i) sum += x[i];
    const double mean = sum / static_cast<double>(group_size);
    double sq = 0;
    for (int64_t i = 0; i < group_size; ++i) sq += (x[i] - mean) * (x[i] - mean);
    const double var = sq / static_cast<double>(group_size);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t cg = 0; cg < channels_per_group; ++cg) {
      const int64_t c = g * channels_per_group + cg;
      double* xc = x + cg * spatial;
      for (int64_t i = 0; i < spatial; ++i) {
        xc[i] =
            (xc[i] - mean) * rstd * static_cast<double>(gamma[c]) + static_cast<double>(beta[c]);
      }
    }
  }
}

std::vector<double> Mean(const SampleTensor& t, const std::vector<int>& dims) {
  if (dims.size() == 4) {  // dims {1,2,3,4}: one value
    double sum = 0;
    for (double v : t.data) sum += v;
    return {sum / static_cast<double>(t.data.size())};
  }
  const int64_t spatial = t.Spatial();  // dims {2,3,4}: one value per channel
  std::vector<double> per_channel(t.channels);
  for (int64_t c = 0; c < t.channels; ++c) {
    double sum = 0;
    for (int64_t i = 0; i < spatial; ++i) sum += t.data[c * spatial + i];
    per_channel[c] = sum / static_cast<double>(spatial);
  }
  return per_channel;
}

}  // namespace fusejit::reference_internal
