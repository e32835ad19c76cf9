// codegen/plan.h: an execution plan -- which kernels run, in what order, what each reads and
// writes, their launch dimensions, and the workspace they share.
//
// A Plan is produced by a Strategy (planner.h) for one chain and is everything the emitter needs
// to write the source (emit.h) and the runtime needs to launch it (jit/). New ways of running a
// chain (recomputing the producer, fusing the mean, tiled tensor-core producers, tuned launch
// shapes) are new strategies producing Plans, not changes to the stages around them.
#ifndef FUSEJIT_CODEGEN_PLAN_H_
#define FUSEJIT_CODEGEN_PLAN_H_

#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "fusejit/signature.h"

namespace fusejit::codegen {

// What a kernel argument points to, and so its C++ type in the generated wrapper. kTensorDType:
// the dtype of the tensor it is bound to (x, y and the parameters: the chain's; kTensor: the
// plan signature's entry; a null argument: the chain's). The others are workspace contents, as
// the templates declare them.
enum class ArgType {
  kTensorDType,
  kFloat,
  kDouble,
  kFloat2,
  kDouble2,
  kInt,
  kBytes,                // unsigned char: an encoding the templates define (igemm's operands)
  kMoments,              // fj::Moments
  kMomentsD,             // fj::MomentsD
  kTcChannelMoments,     // fj::TcChannelMoments
  kIgemmChannelMoments,  // fj::IgemmChannelMoments
};
// The C++ name of a workspace type ("float", "fj::Moments"). REQUIRES: not kTensorDType.
const char* ArgTypeName(ArgType type);

// What a kernel argument is bound to at run time. Strategies say what an argument is (a tensor of
// the signature, a workspace region of some type, read or written); the emitter derives its C++
// type (codegen/emit.cc), so no strategy writes a type string.
struct KernelArg {
  enum class Kind {
    kInput,      // the chain's input x
    kOutput,     // the chain's output y
    kParam,      // a chain parameter by name ("0.weight"); null if the chain has none by that name
    kWorkspace,  // workspace + offset
    kTensor,     // the signature tensor named `param` (plans with their own signature)
  };
  enum class Access { kRead, kWrite };  // kRead: a pointer to const
  Kind kind = Kind::kParam;
  std::string name;   // parameter name in the generated wrapper
  std::string param;  // kParam, kTensor: the tensor's name; empty binds a null pointer
  size_t offset = 0;  // kWorkspace: byte offset (256-byte aligned)
  ArgType type = ArgType::kTensorDType;
  Access access = Access::kRead;

  // x (read), y (written), a parameter (read; `param` empty or absent from the chain: null).
  static KernelArg Input(std::string name = "x");
  static KernelArg Output(std::string name = "y");
  static KernelArg Param(std::string name, std::string param);
  // The signature tensor `tensor` (empty: null), of its dtype.
  static KernelArg Tensor(std::string name, std::string tensor, Access access);
  // A workspace region of `type` at `offset`.
  static KernelArg Workspace(ArgType type, std::string name, size_t offset, Access access);
  // A null pointer of `type` (an operand this plan does not use).
  static KernelArg Null(ArgType type, std::string name, Access access);
};

struct KernelLaunch {
  std::string symbol;   // extern "C" name in the module, e.g. "fj_stats"
  std::string body;     // device function the wrapper calls, e.g. "fj::stats_kernel<Cfg, true>"
  std::string purpose;  // one line for `explain` and the source comment
  std::array<unsigned, 3> grid = {1, 1, 1};
  std::array<unsigned, 3> block = {1, 1, 1};
  unsigned min_blocks_per_sm = 0;  // second __launch_bounds__ argument; 0: none
  unsigned shared_bytes = 0;       // dynamic shared memory
  std::vector<KernelArg> args;
  // Declare every pointer parameter __restrict__ (the tensor-core kernels, as they were measured).
  bool restrict_pointers = false;
};

// A caller's parameter copied into a __constant__ symbol of the module before the kernels run
// (an async device-to-device copy on the run's stream).
struct ConstantCopy {
  std::string param;   // "0.weight"
  std::string symbol;  // name of the __constant__ array in the module
  size_t bytes = 0;
};

// A struct of tuning constants emitted into the source (`struct NAME { static constexpr ... }`),
// read by templates as their Tune parameter. One description drives the source text, the cache
// key (through the source) and the printed plan.
struct TuneStruct {
  struct Field {
    std::string type;  // "int" or "bool"
    std::string name;  // "kThreads"
    std::string value;  // "128", "true"
  };
  std::string name;  // "ConvMomentsTune"
  std::vector<Field> fields;
};

struct WorkspaceRegion {
  std::string name;  // "group moments partials"
  size_t offset = 0;
  size_t bytes = 0;
};

struct Plan {
  std::string strategy;     // name of the strategy that made it
  std::string description;  // why this plan, in one or two sentences
  // The launch configuration it was made for, TuneConfig text ("conv-moments-mean:threads=128,...";
  // codegen/tune_config.h). Set by the planner; printed by ExplainPlan, so part of the source.
  std::string tune_config;
  // Why this strategy: the applicable strategies' estimated costs (the planner's choice), "asked
  // for by name" or the tuning configuration's. Set by the planner; printed by `explain`
  // (CompiledChain::Explain), not by ExplainPlan: the source, and so the cache key, of a plan
  // does not depend on how it was chosen.
  std::string choice;
  // Template files the source includes, in order.
  std::vector<std::string> includes;
  std::vector<TuneStruct> tunes;
  std::vector<ConstantCopy> constant_copies;
  std::vector<KernelLaunch> kernels;  // launched in this order on the run's stream
  std::vector<WorkspaceRegion> workspace;
  size_t workspace_bytes = 0;
  // Non-empty: compile the source for this architecture instead of the target's, e.g. "sm_90a"
  // for kernels using Hopper's architecture-specific instructions (wgmma). The cubin then loads
  // only on devices of exactly that compute capability; the strategy checks the target.
  std::string arch_override;
  // The tensors a run binds. Empty: the forward signature, ForwardSignature(chain,
  // workspace_bytes). Plans of other passes (the backward's) give their own.
  std::vector<TensorSpec> signature;
  // Emit Cfg::pre_d / post_d (the ops' values with their derivatives) for backward templates.
  bool derivatives = false;

  // Reserves `bytes` (rounded up to 256) and returns the region's offset.
  size_t AddWorkspace(std::string name, size_t bytes);
};

// Multi-line, human-readable description (used by `fusejit explain` and the source comment).
std::string ExplainPlan(const Plan& plan);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_PLAN_H_
