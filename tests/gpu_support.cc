#include "tests/gpu_support.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "jit/device.h"
#include "jit/driver.h"

namespace fusejit::testing {

std::string GpuUnavailableReason() {
  static const std::string* reason = [] {
    absl::StatusOr<const jit::DriverApi*> driver = jit::Driver();
    if (!driver.ok()) return new std::string(driver.status().ToString());
    static std::optional<jit::ScopedPrimaryContext> context;  // lives for the test binary
    absl::StatusOr<jit::ScopedPrimaryContext> ctx = jit::ScopedPrimaryContext::Create(0);
    if (!ctx.ok()) return new std::string(ctx.status().ToString());
    context.emplace(*std::move(ctx));
    return new std::string();
  }();
  return *reason;
}

absl::StatusOr<std::vector<std::vector<float>>> RunOnGpu(CompiledChain& compiled,
                                                         const HostInputs& inputs, int runs,
                                                         int timing_reps, double* median_ms) {
  const jit::DriverApi* driver = *jit::Driver();
  auto upload = [](const HostTensor& t) -> absl::StatusOr<jit::DeviceBuffer> {
    absl::StatusOr<jit::DeviceBuffer> buf = jit::DeviceBuffer::Allocate(t.data.size() * 4);
    if (!buf.ok()) return buf.status();
    if (absl::Status s = buf->CopyFromHost(t.data.data(), t.data.size() * 4); !s.ok()) return s;
    return buf;
  };
  absl::StatusOr<jit::DeviceBuffer> x = upload(inputs.x);
  if (!x.ok()) return x.status();
  std::vector<jit::DeviceBuffer> params;
  Bindings bindings;
  bindings.input = x->ptr();
  for (const auto& [name, tensor] : inputs.params) {
    absl::StatusOr<jit::DeviceBuffer> p = upload(tensor);
    if (!p.ok()) return p.status();
    bindings.params[name] = p->ptr();
    params.push_back(*std::move(p));
  }
  const size_t out_count = static_cast<size_t>(NumElements(compiled.output_shape()));
  absl::StatusOr<jit::DeviceBuffer> y = jit::DeviceBuffer::Allocate(out_count * 4);
  if (!y.ok()) return y.status();
  bindings.output = y->ptr();
  absl::StatusOr<Workspace> ws = Workspace::Allocate(compiled.workspace_bytes());
  if (!ws.ok()) return ws.status();
  bindings.workspace = ws->get();
  // Poison the workspace too: a plan must not depend on it being zero.
  if (ws->size() > 0) {
    FUSEJIT_CU_RETURN_IF_ERROR(driver->cuMemsetD32(ws->get(), 0x7fc00000u, ws->size() / 4),
                               "poisoning the workspace");
  }
  std::vector<std::vector<float>> outputs;
  for (int r = 0; r < runs; ++r) {
    if (absl::Status s = y->FillFloat(std::nanf("")); !s.ok()) return s;
    if (absl::Status s = compiled.Run(bindings, nullptr); !s.ok()) return s;
    FUSEJIT_CU_RETURN_IF_ERROR(driver->cuCtxSynchronize(), "synchronizing after the run");
    std::vector<float> out(out_count);
    if (absl::Status s = y->CopyToHost(out.data(), out_count * 4); !s.ok()) return s;
    outputs.push_back(std::move(out));
  }
  if (timing_reps > 0) {
    absl::StatusOr<std::vector<float>> times = jit::EventTimer::Time(
        nullptr, /*warmup=*/1, timing_reps, [&] { return compiled.Run(bindings, nullptr); });
    if (!times.ok()) return times.status();
    if (median_ms) *median_ms = jit::Median(*times);
  }
  return outputs;
}

void CheckChain(const Chain& chain, uint64_t seed, const std::vector<int64_t>& samples,
                const std::string& strategy, Tolerance tol, Precision precision,
                int timing_reps) {
  CompileOptions options;
  options.strategy = strategy;
  options.precision = precision;
  CheckChainWithOptions(chain, seed, options, samples, tol, timing_reps);
}

void CheckChainWithOptions(const Chain& chain, uint64_t seed, const CompileOptions& options,
                           const std::vector<int64_t>& samples, Tolerance tol, int timing_reps) {
  const Precision precision = options.precision;
  SCOPED_TRACE(FormatChain(chain) + (options.strategy.empty() ? "" : " strategy " + options.strategy) +
               (options.tune_config.empty() ? "" : " config " + options.tune_config) +
               (precision == Precision::kTf32 ? " tf32" : ""));
  absl::StatusOr<std::shared_ptr<CompiledChain>> compiled = Compile(chain, options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const HostInputs inputs = RandomInputs(chain, seed);
  double ms = 0;
  absl::StatusOr<std::vector<std::vector<float>>> outs =
      RunOnGpu(**compiled, inputs, /*runs=*/2, timing_reps, &ms);
  ASSERT_TRUE(outs.ok()) << outs.status();
  const std::vector<float>& y = (*outs)[0];
  ASSERT_EQ(std::memcmp(y.data(), (*outs)[1].data(), y.size() * 4), 0)
      << "two runs differ: a race or a non-deterministic reduction";
  int64_t unwritten = 0;
  for (float v : y) unwritten += std::isnan(v);
  ASSERT_EQ(unwritten, 0) << "outputs left unwritten (still NaN)";

  // The float64 reference of the last chain checked is kept for the next check of the same one.
  static auto* last_key = new std::string();
  static auto* last_ref = new std::vector<double>();
  const std::string key =
      absl::StrCat(FormatChain(chain), "|", seed, "|", absl::StrJoin(samples, ","));
  if (key != *last_key) {
    last_key->clear();
    ReferenceOptions ropt;
    ropt.samples = samples;
    absl::StatusOr<std::vector<double>> ref = RunReference(chain, inputs, ropt);
    ASSERT_TRUE(ref.ok()) << ref.status();
    *last_ref = *std::move(ref);
    *last_key = key;
  }
  const std::vector<double>& ref = *last_ref;
  // Gather the same samples from the GPU output.
  const Shape out_shape = OutputShape(chain);
  const int64_t per_sample = NumElements(out_shape) / out_shape[0];
  std::vector<float> picked;
  if (samples.empty()) {
    picked = y;
  } else {
    for (int64_t s : samples) {
      picked.insert(picked.end(), y.begin() + s * per_sample, y.begin() + (s + 1) * per_sample);
    }
  }
  ASSERT_EQ(picked.size(), ref.size());
  const ErrorStats err = CompareToReference(picked.data(), ref.data(), ref.size());
  EXPECT_EQ(err.non_finite, 0);
  EXPECT_LE(err.rel_l2, tol.rel_l2) << "max_abs " << err.max_abs;
  EXPECT_LE(err.max_abs, tol.max_abs) << "rel_l2 " << err.rel_l2;
  const std::string timing = timing_reps > 0 ? absl::StrFormat("  %.4f ms", ms) : "";
  std::printf("  rel_l2 %.2e  max_abs %.2e%s  %s%s\n", err.rel_l2, err.max_abs, timing.c_str(),
              FormatChain(chain).c_str(), precision == Precision::kTf32 ? " (tf32)" : "");
}

}  // namespace fusejit::testing
