// examples/run_and_check.h: steps 2-5 of every example -- the fusejit API after the chain is
// described: compile it, allocate and bind buffers by name, run on a stream, compare with the CPU
// reference. The context and device buffers come from jit/device.h, fusejit's small helpers over
// the CUDA driver API (which fusejit loads at run time); an application uses whatever it already
// has (the CUDA runtime, PyTorch tensors, ...): fusejit only needs a current context and device
// pointers. Header-only so that each example stays one translation unit to copy from.
#ifndef FUSEJIT_EXAMPLES_RUN_AND_CHECK_H_
#define FUSEJIT_EXAMPLES_RUN_AND_CHECK_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "jit/device.h"

namespace fusejit_example {

using fusejit::jit::DeviceBuffer;

inline int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

inline absl::StatusOr<DeviceBuffer> Upload(const fusejit::HostTensor& t) {
  auto buffer = DeviceBuffer::Allocate(t.data.size() * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  if (absl::Status s = buffer->CopyFromHost(t.data.data(), t.data.size() * sizeof(float));
      !s.ok()) {
    return s;
  }
  return buffer;
}

// Compiles and runs a valid `chain` on device 0 with random inputs and checks the first and the
// last sample against the float64 reference. Returns main's exit code: 0 PASS, 1 otherwise.
inline int RunAndCheck(const fusejit::Chain& chain) {
  std::printf("chain: %s\n", fusejit::FormatChain(chain).c_str());

  // 2. A CUDA context on device 0 (fusejit runs in whatever context is current), then compile
  //    for its architecture: plan, generate CUDA source, NVRTC (or the kernel cache).
  auto context = fusejit::jit::ScopedPrimaryContext::Create(0);
  if (!context.ok()) return Fail("this example needs an NVIDIA GPU", context.status());
  auto compiled = fusejit::Compile(chain);
  if (!compiled.ok()) return Fail("compile", compiled.status());
  fusejit::CompiledChain& kernel = **compiled;

  // 3. Random data (x like torch.rand, PyTorch-style weights, random GroupNorm weight and bias),
  //    copied to the device and bound by PyTorch's parameter names ("0.weight", "0.bias", ...).
  const fusejit::HostInputs inputs = fusejit::RandomInputs(chain, /*seed=*/0);
  fusejit::Bindings bindings;
  std::vector<DeviceBuffer> buffers;  // owns every device buffer until the end of main
  auto x = Upload(inputs.x);
  if (!x.ok()) return Fail("upload x", x.status());
  bindings.input = x->ptr();
  for (const fusejit::ParamSpec& p : kernel.params()) {
    auto buffer = Upload(inputs.params.at(p.name));
    if (!buffer.ok()) return Fail(p.name, buffer.status());
    bindings.params[p.name] = buffer->ptr();
    buffers.push_back(*std::move(buffer));
  }
  const int64_t count = fusejit::NumElements(kernel.output_shape());
  auto y = DeviceBuffer::Allocate(count * sizeof(float));
  if (!y.ok()) return Fail("allocate y", y.status());
  bindings.output = y->ptr();
  auto workspace = fusejit::Workspace::Allocate(kernel.workspace_bytes());
  if (!workspace.ok()) return Fail("allocate the workspace", workspace.status());
  bindings.workspace = workspace->get();

  // 4. Run on the default stream; the synchronous copy back waits for it.
  if (absl::Status s = kernel.Run(bindings, /*stream=*/nullptr); !s.ok()) return Fail("run", s);
  std::vector<float> out(count);
  if (absl::Status s = y->CopyToHost(out.data(), count * sizeof(float)); !s.ok()) {
    return Fail("copy y back", s);
  }

  // 5. The float64 CPU reference on the first and the last sample, against those two samples.
  const int64_t n = chain.input[0], per_sample = count / n;
  auto ref = fusejit::RunReference(chain, inputs, {.samples = {0, n - 1}});
  if (!ref.ok()) return Fail("reference", ref.status());
  std::vector<float> checked(out.begin(), out.begin() + per_sample);
  checked.insert(checked.end(), out.end() - per_sample, out.end());
  const fusejit::ErrorStats e =
      fusejit::CompareToReference(checked.data(), ref->data(), static_cast<int64_t>(ref->size()));
  const bool pass = e.rel_l2 <= 1e-5 && e.max_abs <= 1e-4 && e.non_finite == 0;
  std::printf("output %s: max abs err %.3e, rel L2 err %.3e: %s\n",
              fusejit::FormatShape(kernel.output_shape()).c_str(), e.max_abs, e.rel_l2,
              pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace fusejit_example

#endif  // FUSEJIT_EXAMPLES_RUN_AND_CHECK_H_
