// fusejit/fusejit.h: compile a chain into shape-specialized kernels and run them.
//
//   auto chain = fusejit::ParseChain("x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | relu");
//   auto compiled = fusejit::Compile(*chain, {});            // needs a current CUDA context
//   fusejit::Bindings b{.input = d_x, .output = d_y, .workspace = d_ws};
//   b.params["0.weight"] = d_w; b.params["0.bias"] = d_b;
//   absl::Status s = (*compiled)->Run(b, stream);
//
// Nothing here throws; failures are absl::Status with a message naming what was wrong.
#ifndef FUSEJIT_FUSEJIT_H_
#define FUSEJIT_FUSEJIT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusejit/chain.h"
#include "fusejit/signature.h"

// The driver API's handle types, declared exactly as cuda.h declares them, so that this header does
// not require cuda.h. Interchangeable with cuda.h's.
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr_v2;  // NOLINT: cuda.h's spelling
typedef CUdeviceptr_v2 CUdeviceptr;

namespace fusejit {

namespace cache {
class KernelCache;  // cache/kernel_cache.h
}  // namespace cache
namespace tune {
class TuningDb;  // tune/tuning_db.h
}  // namespace tune

// Numeric precision a caller may ask for by name; never chosen silently.
enum class Precision {
  kFp32,  // default: fp32 arithmetic, accurate to ~1e-6 relative against a float64 reference
  kTf32,  // opt-in: the TF32 class where a plan can use it (~1e-3 relative): tensor-core
          // products of operands rounded to 11 significant bits -- TF32, or fp16 values of
          // power-of-two-scaled operands (the same rounding, twice the rate; igemm, wgmma
          // weight gradients)
};

// A kind of GPU, as the tuning database keys its entries (tune/tuning_db.h).
struct DeviceKey {
  std::string name;        // "NVIDIA H100 80GB HBM3"; empty: no device
  int sm_count = 0;
  int driver_version = 0;  // 1000 * major + 10 * minor, e.g. 13000
  bool empty() const { return name.empty(); }
  friend bool operator==(const DeviceKey&, const DeviceKey&) = default;
};

struct CompileOptions {
  // Target architecture, "sm_80", "sm_90", ... Empty: the device of the current CUDA context
  // (which requires a driver).
  std::string arch;
  Precision precision = Precision::kFp32;
  // Force a plan strategy by name (see `fusejit explain`); empty: the planner chooses.
  std::string strategy;
  // When non-empty, every generated source (and PTX) is written below this folder. The
  // environment variable FUSEJIT_DUMP_DIR has the same effect when this is empty.
  std::string dump_dir;
  // Use the kernel cache (memory and disk). FUSEJIT_DISABLE_CACHE=1 turns the disk part off.
  bool use_cache = true;
  // A launch configuration to use instead of the tuned or heuristic one: the text `fusejit
  // explain` and `fusejit autotune` print ("config:"), e.g.
  // "conv-moments-mean:threads=128,min_blocks=3,ph=1,pw=6,blocks_per_sample=8,csplit=1,ksplit=1". It must
  // name an applicable strategy (the same as `strategy` when both are set) and pass that
  // strategy's checks; an error says which check failed.
  std::string tune_config;
  // When tune_config is empty: use the tuning database's entry for this chain and device (written
  // by `fusejit autotune`, stored beside the kernel cache) if there is a current, valid one
  // (an entry for another strategy than a given `strategy` is ignored); else the heuristic
  // default. The device is the current context's when `arch` is empty; with an explicit arch it
  // is `tuning_device`, and without one there is no device and the default is used.
  // FUSEJIT_DISABLE_TUNING=1 turns the database off.
  bool use_tuning = true;
  // With an explicit arch: the device to plan for (its SM count) and whose tuned entries to use,
  // e.g. to prewarm for a GPU this machine lacks. Ignored when arch is empty.
  DeviceKey tuning_device;
  // The kernel cache and tuning database to use; nullptr: the process's defaults
  // (KernelCache::Default(), TuningDb::Default(), configured from the environment).
  cache::KernelCache* kernel_cache = nullptr;
  tune::TuningDb* tuning_db = nullptr;
};

// Device buffers for one run by signature name ("x", "y", "0.weight", ..., "workspace"; see
// CompiledChain::signature()). Pointers are device pointers owned by the caller, aligned as the
// signature says (16 bytes; the workspace 256), as cuMemAlloc and PyTorch's allocator return them.
using NamedBindings = std::map<std::string, CUdeviceptr, std::less<>>;

// The common forward case with fixed fields; Named() gives the same bindings by name.
struct Bindings {
  CUdeviceptr input = 0;                     // x, the chain's dtype and input shape
  CUdeviceptr output = 0;                    // y, the chain's dtype, OutputShape(chain)
  CUdeviceptr workspace = 0;                 // WorkspaceBytes() bytes, 256-byte aligned; may be 0 if
                                             // WorkspaceBytes() == 0
  std::map<std::string, CUdeviceptr> params; // "0.weight" -> pointer, for every ChainParams() entry
  // x, y, workspace (when non-null) and the params, by signature name.
  NamedBindings Named() const;
};

// Timings of the compile pipeline, for logs and `fusejit compile`.
struct CompileStats {
  double plan_ms = 0;
  double codegen_ms = 0;
  double nvrtc_ms = 0;   // 0 when the cubin came from the cache
  bool cache_hit = false;
  std::string source_path;  // where the generated source was dumped, if it was
  // Where the launch configuration came from: "default" (the strategy's heuristic), "tuned"
  // (the tuning database) or "given" (CompileOptions::tune_config).
  std::string tune_origin;
};

class CompiledChain {
 public:
  virtual ~CompiledChain() = default;

  virtual const Chain& chain() const = 0;
  virtual const std::string& arch() const = 0;
  // The plan's strategy ("mma-moments-mean", "elementwise", ...; see `fusejit explain`).
  virtual const std::string& strategy() const = 0;
  // Size of the compiled module (cubin) in bytes.
  virtual size_t cubin_bytes() const = 0;
  virtual Shape output_shape() const = 0;
  // Every tensor a run binds (fusejit/signature.h): x, the parameters, y, the workspace.
  virtual const std::vector<TensorSpec>& signature() const = 0;
  // The parameters of signature(), as ChainParams gives them.
  virtual std::vector<ParamSpec> params() const = 0;
  virtual size_t workspace_bytes() const = 0;
  virtual const CompileStats& stats() const = 0;
  // Human-readable plan: strategy, kernels, launch dimensions, workspace layout, source path.
  virtual std::string Explain() const = 0;
  // The generated CUDA source (main translation unit).
  virtual const std::string& source() const = 0;

  // Loads the module into the current CUDA context (done by the first Run otherwise). Call it
  // before capturing Run into a CUDA graph.
  virtual absl::Status Load() = 0;

  // Enqueues the chain's kernels on `stream`. Performs no allocation and no synchronization once
  // the module is loaded in the current context, so it may be captured in a CUDA graph.
  // REQUIRES: every pointer in `bindings` is valid for the sizes above; buffers must not alias.
  // Thread-safe: concurrent Runs with distinct bindings are allowed.
  virtual absl::Status Run(const Bindings& bindings, CUstream stream) = 0;
  // The same with bindings by signature name. Every tensor of signature() must be bound to a
  // non-null pointer of its alignment; an unknown name is an error (listing the valid ones). A
  // "workspace" bound for a plan that needs none is ignored.
  virtual absl::Status RunNamed(const NamedBindings& bindings, CUstream stream) = 0;
  // The same with one pointer per signature() tensor, in its order (the language bindings' fast
  // path: no names to look up). Checked for count, null and alignment.
  virtual absl::Status RunTensors(const CUdeviceptr* tensors, size_t count, CUstream stream) = 0;

  // Profiling: the plan's kernels in launch order, and a Run that enqueues only the first
  // `count` of them (count <= kernel_count(); InvalidArgument otherwise). The output is complete
  // only when count == kernel_count(). `fusejit bench --kernels` times prefixes with it.
  virtual size_t kernel_count() const = 0;
  virtual std::string kernel_name(size_t i) const = 0;  // "" when i >= kernel_count()
  virtual absl::Status RunFirstKernels(const Bindings& bindings, CUstream stream,
                                       size_t count) = 0;
  // The same with bindings by signature name (every kind of chain, the backward's included).
  virtual absl::Status RunFirstKernelsNamed(const NamedBindings& bindings, CUstream stream,
                                            size_t count) = 0;
};

// Plans, generates source and compiles it with NVRTC (or fetches the cubin from the cache).
// Works without a GPU when options.arch is set. The same (chain, options, device) returns the same
// shared instance from the in-memory cache. Thread-safe.
absl::StatusOr<std::shared_ptr<CompiledChain>> Compile(const Chain& chain,
                                                       const CompileOptions& options = {});

// The backward of `chain`: from the upstream gradient grad_y (dL/dy), the gradients of x and of
// every parameter. Its signature is BackwardSignature(chain, workspace_bytes()): bind x, the
// parameters, grad_y, grad_x, grad_<param> for every parameter ("grad_0.weight") and the
// workspace by name (RunNamed) or in signature order (RunTensors); every grad_ tensor is written
// in full. It recomputes what it needs from x and the parameters (the forward saves nothing), so
// it may run after any forward of the same inputs, or without one. Deterministic: every sum is
// taken in a fixed order (no float atomics), so two runs give bitwise identical gradients.
// Accuracy: fp32, sums in double; `options.precision` kTf32 lets its convolutions use the TF32
// class. Run(Bindings) and RunFirstKernels(Bindings) are the forward's fixed fields: here they
// fail; use the named forms. options.strategy and options.tune_config name forward plans and
// must be empty. f32, bf16 and f16 chains (bf16/f16: the f32 backward between casts, gradients
// rounded to the chain's dtype once; their gradient convolutions in the TF32 class, grad_u
// rounded as PyTorch's own bf16/f16 backward rounds it: runtime/dtype_adapter.h,
// BackwardGemmPrecision).
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackward(const Chain& chain,
                                                               const CompileOptions& options = {});

// Training: the forward of `chain` that also saves what its backward would otherwise recompute,
// and the backward that reads it.
//
// CompileTrainingForward: y as Compile's forward gives it (bitwise, except a bf16/f16 plan whose
// 16-bit tensor-core sums it flushes so that u is as accurate as the f32 chain's, as Explain says:
// then y may differ in its last bit) and, where saving pays, the producer's
// output "u" (role kSaved, f32, written in full; shaped as the signature says: the producer's
// output shape [N, C, D, H, W], or [N, D, H, C, W] -- the same values, the rows of every channel
// side by side -- where the fused plan stores it faster so and the backward reads that layout:
// codegen::ULayout; bind it as the signature gives it, don't interpret it): two steps, the
// producer alone into u, then the ops after it from u into y. Saving turns a step of fused
// forward + recompute + backward into producer + the ops from u + backward, so it pays when the
// ops from u cost less than the fused forward: the planner's cost model decides (Explain gives
// both estimates and u's bytes, held until the backward). Only chains with ops after their
// conv3d / conv_transpose3d can save; bf16 and f16 chains only by their own (native) plan writing
// u, in f32 (their backward is the f32 one between casts; it binds u as written). Where it does not
// save it is Compile's forward and its signature has no kSaved tensor. Where the chain's own plan
// can write u (one step), and its plan offers them too (the convt-* plans), it also saves "stats"
// after u: the group statistics it normalized with, f32 [N, groups, 2] (mean, rstd). Where that
// plan computes a chain ending in group_norm | mean from per-block channel moments
// (mma-moments-mean: W2, W4), it saves them after u as "moments", f32 [N, blocks, C, 3] (count,
// mean, M2 of each of a sample's blocks; bind it as the signature gives it), and the backward takes
// grad_y's sums from them instead of a pass over u.
// CompileBackwardFromSaved: CompileBackward's gradients, with "u" (and "stats" or "moments" where
// the training forward saves them; kSaved, read) bound after grad_y: what a CompileTrainingForward
// run of the same x and parameters, with the same options, wrote. InvalidArgument for a chain
// whose training forward saves nothing (use CompileBackward).
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileTrainingForward(
    const Chain& chain, const CompileOptions& options);
absl::StatusOr<std::shared_ptr<CompiledChain>> CompileBackwardFromSaved(
    const Chain& chain, const CompileOptions& options);
// Whether CompileTrainingForward of `chain` with `options` saves u (false for an invalid chain or
// when the options' target cannot be resolved: no arch and no device).
bool TrainingForwardSaves(const Chain& chain, const CompileOptions& options = {});

// Convenience for callers who want fusejit to own the workspace: allocates WorkspaceBytes() in
// the current context. Freed by the destructor.
class Workspace {
 public:
  static absl::StatusOr<Workspace> Allocate(size_t bytes);
  Workspace(Workspace&&) noexcept;
  Workspace& operator=(Workspace&&) noexcept;
  ~Workspace();
  CUdeviceptr get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  Workspace(CUdeviceptr ptr, size_t bytes) : ptr_(ptr), bytes_(bytes) {}
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Version string of the generator; part of every kernel-cache key.
const char* GeneratorVersion();

// GeneratorVersion() and a digest of this build's templates and planner sources, e.g.
// "fusejit-0.1.0+g0123456789ab". Tuning records and the drop-in's timing decisions carry it: a
// configuration or decision measured by another build of the generator is stale (its kernels or
// plans may differ) and is not used.
const char* GeneratorBuild();

}  // namespace fusejit

#endif  // FUSEJIT_FUSEJIT_H_
