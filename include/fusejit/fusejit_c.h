/* fusejit/fusejit_c.h: the C ABI of libfusejit.so, for language bindings (the Python package
 * `fusejit` uses it through ctypes) and C callers.
 *
 *   fj_chain* chain = NULL;
 *   fj_compile_options opts = {sizeof(opts)};              // zero = defaults
 *   if (fj_compile("x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | relu", &opts, &chain) != FJ_OK)
 *     fprintf(stderr, "%s\n", fj_last_error());
 *   const char* names[] = {"x", "0.weight", "0.bias", "y"};
 *   CUdeviceptr ptrs[] = {d_x, d_w, d_b, d_y};
 *   fj_chain_run(chain, names, ptrs, 4, stream);            // no allocation, no synchronization
 *   fj_chain_release(chain);
 *
 * The backward pass of the same spec (fj_compile_backward) is a chain like any other: its
 * signature binds x, the parameters, grad_y (dL/dy), and writes grad_x and grad_<param>
 * (dL/dx, dL/dparam) in full; it is run with fj_chain_run / fj_chain_run_tensors.
 *
 * Contracts:
 * - Every function returns FJ_OK (0) or an error code (absl's status codes); the message of the
 *   calling thread's last error (what was wrong and what would be right) is fj_last_error().
 * - No C++ exception crosses this interface; every entry point is thread-safe. A chain may be run
 *   from several threads at once (with distinct output buffers).
 * - Handles are checked: a NULL, unknown or already released fj_chain* is refused with
 *   FJ_INVALID_ARGUMENT (so a double release is reported, not undefined). A release concurrent with
 *   a run of the same handle is safe: the run keeps the chain alive until it returns.
 * - fusejit runs in the caller's CUDA context: calls that take a `device` (the ordinal of the GPU
 *   whose memory the pointers are in) keep the context current on the calling thread when it is
 *   on that device, and otherwise use that device's primary context (the one PyTorch and the
 *   CUDA runtime use) for the call, restoring the previous context after, as PyTorch's device
 *   guard does. It never creates a context of its own.
 * - Strings returned by fj_chain_* stay valid until the chain is released.
 * - Versions: FUSEJIT_C_ABI_VERSION (fj_abi_version) changes only with a change that breaks
 *   existing callers. Additions (functions, enum values) raise FUSEJIT_C_ABI_MINOR (fj_abi_minor)
 *   and put their symbols in a new version node FUSEJIT_1.<minor> of capi/fusejit_c.map, so a
 *   program linked against them names what it needs from the library. Minor 1 added
 *   fj_compile_backward, the backward roles FJ_ROLE_GRAD_*, fj_role_name and fj_abi_minor.
 *   Minor 2 added fj_compile_training_forward and fj_compile_backward_saved (FJ_ROLE_SAVED).
 */
#ifndef FUSEJIT_FUSEJIT_C_H_
#define FUSEJIT_FUSEJIT_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FUSEJIT_C_ABI_VERSION 1
#define FUSEJIT_C_ABI_MINOR 2

typedef struct CUstream_st* CUstream; /* as cuda.h declares it */
typedef unsigned long long fj_deviceptr; /* CUdeviceptr */

enum {
  FJ_OK = 0,
  FJ_CANCELLED = 1,
  FJ_UNKNOWN = 2,
  FJ_INVALID_ARGUMENT = 3,
  FJ_NOT_FOUND = 5,
  FJ_FAILED_PRECONDITION = 9,
  FJ_OUT_OF_RANGE = 11,
  FJ_UNIMPLEMENTED = 12,
  FJ_INTERNAL = 13,
  FJ_UNAVAILABLE = 14,
};

/* Tensor roles and dtypes, as fusejit/signature.h and fusejit/chain.h number them. Roles 0-3 are
 * the forward's; a backward chain (fj_compile_backward) has x (INPUT), the parameters (PARAM),
 * grad_y (GRAD_OUTPUT, read), grad_x (GRAD_INPUT, written), grad_<param> (GRAD_PARAM, written)
 * and the WORKSPACE. FJ_ROLE_SAVED (minor 2): a tensor a training forward
 * (fj_compile_training_forward) writes and its backward (fj_compile_backward_saved) reads. New
 * roles may be added; treat an unknown one as an error. */
enum {
  FJ_ROLE_INPUT = 0,
  FJ_ROLE_OUTPUT = 1,
  FJ_ROLE_PARAM = 2,
  FJ_ROLE_WORKSPACE = 3,
  FJ_ROLE_GRAD_OUTPUT = 4, /* minor 1 */
  FJ_ROLE_GRAD_INPUT = 5,  /* minor 1 */
  FJ_ROLE_GRAD_PARAM = 6,  /* minor 1 */
  FJ_ROLE_SAVED = 7,       /* minor 1 (reserved), used from minor 2 */
};
enum { FJ_DTYPE_F32 = 0, FJ_DTYPE_F16 = 1, FJ_DTYPE_BF16 = 2, FJ_DTYPE_F64 = 3 };

typedef struct fj_chain fj_chain;

/* Zero-initialized (with struct_size set) means the defaults. */
typedef struct fj_compile_options {
  size_t struct_size;      /* sizeof(fj_compile_options) of the caller's header */
  const char* arch;        /* "sm_80", "sm_90", ...; NULL or "": the device below */
  int device;              /* with arch empty: the CUDA device ordinal to compile for */
  const char* precision;   /* "fp32" (default, fp32-accurate) or "tf32"; NULL: "fp32" */
  const char* strategy;    /* force a plan strategy by name; NULL: the planner chooses */
  const char* tune_config; /* a launch configuration (`fusejit explain` prints "config:"); NULL: none */
  int disable_cache;       /* nonzero: compile without the kernel cache */
  int disable_tuning;      /* nonzero: ignore the tuning database */
} fj_compile_options;

typedef struct fj_tensor_info {
  const char* name;   /* "x", "y", "0.weight", "workspace"; backward: "grad_y", "grad_x",
                         "grad_0.weight", ... */
  int role;           /* FJ_ROLE_* (fj_role_name gives its name) */
  int dtype;          /* FJ_DTYPE_* (meaningless for the workspace) */
  int ndim;
  int64_t shape[8];   /* the workspace: {bytes} */
  size_t bytes;
  size_t alignment;
} fj_tensor_info;

int fj_abi_version(void);          /* FUSEJIT_C_ABI_VERSION of the library */
int fj_abi_minor(void);            /* FUSEJIT_C_ABI_MINOR of the library (minor 1) */
const char* fj_version(void);      /* GeneratorBuild(): the generator version and build digest */
const char* fj_last_error(void);   /* this thread's last error message; "" after success */

/* Parses `spec`, checks it, and returns its canonical text in *canonical (valid until the next
 * call on this thread). No GPU needed. */
int fj_canonical_spec(const char* spec, const char** canonical);

/* The kernel cache's resolved directory ("" when there is none) in *dir, valid until the next
 * call on this thread. The tuning database and the Python package's policy decisions live
 * beside it. */
int fj_cache_dir(const char** dir);

/* Plans and compiles `spec` (or takes it from the kernel cache). `options` may be NULL. */
int fj_compile(const char* spec, const fj_compile_options* options, fj_chain** out);

/* The backward of `spec` (minor 1): a chain computing dL/dx and dL/dparam for every parameter
 * from the upstream gradient dL/dy. Same options (strategy and tune_config must be NULL: they name
 * forward plans), errors and handle as fj_compile; every fj_chain_* function takes the handle.
 * Its signature, in order: x, the parameters (as the forward's), grad_y (the output's shape),
 * grad_x, grad_<param> for every parameter ("grad_0.weight"), then "workspace" when
 * fj_chain_workspace_bytes is not 0. A run writes every grad_ tensor in full, deterministically
 * (two runs give bitwise identical gradients); it recomputes what it needs from x and the
 * parameters, so it needs no forward run before it. FJ_UNIMPLEMENTED for chains without a
 * backward plan: f64 chains. */
int fj_compile_backward(const char* spec, const fj_compile_options* options, fj_chain** out);

/* Training (minor 2): a forward that saves the convolution's output for its backward, and the
 * backward that reads it instead of recomputing the convolution (fusejit.h,
 * CompileTrainingForward). fj_compile_training_forward's signature is the forward's (x, the
 * parameters, y) then "u" (FJ_ROLE_SAVED, f32, written; the convolution's output shape, or its
 * [N, D, H, C, W] permutation where the plan lays it out so: bind it as fj_chain_tensor gives
 * it), where its plan offers them "stats" (FJ_ROLE_SAVED, f32 [N, groups, 2]: the group mean
 * and rstd it normalized with) or "moments" (FJ_ROLE_SAVED, f32 [N, blocks, C, 3]: its per-block
 * channel moments, for chains ending in group_norm | mean), and the workspace -- where saving
 * pays (chains with ops after their convolution that cost less from u than the fused forward, by
 * the planner's cost model; bf16/f16 chains where their own plan writes u, in f32); for any
 * other chain it is fj_compile's chain, with no SAVED tensor. fj_compile_backward_saved's is
 * fj_compile_backward's with the same SAVED tensors (read) after grad_y, in the same order: bind
 * every SAVED tensor the training forward wrote (fj_chain_tensor); FJ_INVALID_ARGUMENT for a chain
 * whose training forward saves nothing. Same options as fj_compile_backward (strategy,
 * tune_config NULL) and as the training forward. */
int fj_compile_training_forward(const char* spec, const fj_compile_options* options,
                                fj_chain** out);
int fj_compile_backward_saved(const char* spec, const fj_compile_options* options, fj_chain** out);

int fj_chain_release(fj_chain* chain);

/* "input", "output", "param", "workspace", "grad_output", "grad_input", "grad_param", "saved"
 * for an FJ_ROLE_* value; NULL for any other (minor 1). */
const char* fj_role_name(int role);

int fj_chain_spec(const fj_chain* chain, const char** spec);         /* canonical spec */
int fj_chain_strategy(const fj_chain* chain, const char** strategy); /* the plan's strategy */
int fj_chain_explain(const fj_chain* chain, const char** text);      /* `fusejit explain` text */
int fj_chain_workspace_bytes(const fj_chain* chain, size_t* bytes);
int fj_chain_tensor_count(const fj_chain* chain, size_t* count);
int fj_chain_tensor(const fj_chain* chain, size_t index, fj_tensor_info* info);

/* Loads the chain's module into the current context (or `device`'s primary one); do it before
 * capturing runs into a CUDA graph. */
int fj_chain_load(fj_chain* chain, int device);

/* Enqueues the chain on `stream` with `count` pointers bound by signature name. Every tensor of
 * the signature must be bound. No allocation and no synchronization once loaded. */
int fj_chain_run(fj_chain* chain, const char* const* names, const fj_deviceptr* pointers,
                 size_t count, CUstream stream, int device);

/* The same with one pointer per signature tensor, in signature order (fj_chain_tensor's index
 * order): the fast path for bindings that resolved the names once. */
int fj_chain_run_tensors(fj_chain* chain, const fj_deviceptr* pointers, size_t count,
                         CUstream stream, int device);

#ifdef __cplusplus
}
#endif

#endif /* FUSEJIT_FUSEJIT_C_H_ */
