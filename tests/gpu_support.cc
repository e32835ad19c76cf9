#include "tests/gpu_support.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
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
                                                         const HostInputs& inputs, int runs) {
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
  return outputs;
}

}  // namespace fusejit::testing
