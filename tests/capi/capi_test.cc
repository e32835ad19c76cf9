// The C ABI of libfusejit.so (include/fusejit/fusejit_c.h), linked as a user links it: only the
// exported fj_* symbols. CPU only: compiles for an explicit arch; runs check bindings before they
// need a driver. The GPU path is exercised by the Python package's GPU tests.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fusejit/fusejit_c.h"

namespace {

constexpr const char* kSpec = "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | swish | group_norm(groups=2)";

fj_compile_options Sm90() {
  fj_compile_options o{};
  o.struct_size = sizeof(o);
  o.arch = "sm_90";
  return o;
}

fj_chain* CompileBackwardOrDie(const char* spec) {
  fj_compile_options o = Sm90();
  fj_chain* chain = nullptr;
  EXPECT_EQ(fj_compile_backward(spec, &o, &chain), FJ_OK) << fj_last_error();
  return chain;
}

fj_chain* CompileOrDie(const char* spec) {
  fj_compile_options o = Sm90();
  fj_chain* chain = nullptr;
  EXPECT_EQ(fj_compile(spec, &o, &chain), FJ_OK) << fj_last_error();
  return chain;
}

TEST(CApi, VersionAndCanonicalSpec) {
  EXPECT_EQ(fj_abi_version(), FUSEJIT_C_ABI_VERSION);
  EXPECT_EQ(fj_abi_minor(), FUSEJIT_C_ABI_MINOR);
  // GeneratorBuild(): "fusejit-<version>+g" and 12 hex digits of the build's generator digest.
  const std::string version = fj_version();
  EXPECT_EQ(version.rfind("fusejit-", 0), 0u) << version;
  ASSERT_GT(version.size(), 14u) << version;
  EXPECT_EQ(version.substr(version.size() - 14, 2), "+g") << version;
  EXPECT_EQ(version.find_first_not_of("0123456789abcdef", version.size() - 12), std::string::npos)
      << version;
  const char* canonical = nullptr;
  ASSERT_EQ(fj_canonical_spec("x : f32[1,3,4,4,4]|silu", &canonical), FJ_OK);
  EXPECT_STREQ(canonical, "x:f32[1,3,4,4,4] | swish");
  EXPECT_STREQ(fj_last_error(), "");
}

TEST(CApi, CompileGivesTheSignature) {
  fj_chain* chain = CompileOrDie(kSpec);
  ASSERT_NE(chain, nullptr);
  const char* spec = nullptr;
  ASSERT_EQ(fj_chain_spec(chain, &spec), FJ_OK);
  EXPECT_STREQ(spec, "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | swish | group_norm(groups=2,eps=1e-5)");
  const char* strategy = nullptr;
  ASSERT_EQ(fj_chain_strategy(chain, &strategy), FJ_OK);
  EXPECT_NE(std::string(strategy), "");
  const char* explain = nullptr;
  ASSERT_EQ(fj_chain_explain(chain, &explain), FJ_OK);
  EXPECT_NE(std::string(explain).find(strategy), std::string::npos);
  EXPECT_NE(std::string(explain).find("tensors (bound by name):\n  x f32[2,3,8,8,8] input\n"),
            std::string::npos)
      << explain;

  size_t count = 0, workspace = 0;
  ASSERT_EQ(fj_chain_tensor_count(chain, &count), FJ_OK);
  ASSERT_EQ(fj_chain_workspace_bytes(chain, &workspace), FJ_OK);
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    fj_tensor_info t;
    ASSERT_EQ(fj_chain_tensor(chain, i, &t), FJ_OK);
    names.push_back(t.name);
    if (names.back() == "x") {
      EXPECT_EQ(t.role, FJ_ROLE_INPUT);
      EXPECT_EQ(t.dtype, FJ_DTYPE_F32);
      ASSERT_EQ(t.ndim, 5);
      EXPECT_EQ(t.shape[0], 2);
      EXPECT_EQ(t.shape[4], 8);
      EXPECT_EQ(t.bytes, 2u * 3 * 8 * 8 * 8 * 4);
    } else if (names.back() == "y") {
      EXPECT_EQ(t.role, FJ_ROLE_OUTPUT);
      ASSERT_EQ(t.ndim, 5);
      EXPECT_EQ(t.shape[1], 8);
      EXPECT_EQ(t.shape[2], 6);
    } else if (names.back() == "0.weight") {
      EXPECT_EQ(t.role, FJ_ROLE_PARAM);
      EXPECT_EQ(t.ndim, 5);
      EXPECT_EQ(t.shape[0], 8);
      EXPECT_EQ(t.shape[1], 3);
    } else if (names.back() == "workspace") {
      EXPECT_EQ(t.role, FJ_ROLE_WORKSPACE);
      EXPECT_EQ(t.bytes, workspace);
      EXPECT_EQ(t.alignment, 256u);
    }
  }
  std::vector<std::string> expected = {"x", "0.weight", "0.bias", "2.weight", "2.bias", "y"};
  if (workspace > 0) expected.push_back("workspace");
  EXPECT_EQ(names, expected);
  fj_tensor_info t;
  EXPECT_EQ(fj_chain_tensor(chain, count, &t), FJ_OUT_OF_RANGE);
  EXPECT_NE(std::string(fj_last_error()).find("past the signature"), std::string::npos);
  EXPECT_EQ(fj_chain_release(chain), FJ_OK);
}

TEST(CApi, ErrorsSayWhatWasWrongAndWhatWouldBeRight) {
  fj_compile_options o = Sm90();
  fj_chain* chain = reinterpret_cast<fj_chain*>(0x1);
  EXPECT_EQ(fj_compile("x:f32[2,3,8,8,8] | conv3d(out=8,k=3,strde=2)", &o, &chain),
            FJ_INVALID_ARGUMENT);
  EXPECT_EQ(chain, nullptr);
  EXPECT_NE(std::string(fj_last_error()).find("strde"), std::string::npos) << fj_last_error();
  EXPECT_NE(std::string(fj_last_error()).find("stride"), std::string::npos) << fj_last_error();

  o.precision = "fp64";
  EXPECT_EQ(fj_compile(kSpec, &o, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("fp32 or tf32"), std::string::npos);

  o = Sm90();

  o.struct_size = 3;
  EXPECT_EQ(fj_compile(kSpec, &o, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("struct_size"), std::string::npos);

  EXPECT_EQ(fj_compile(nullptr, nullptr, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_EQ(fj_compile(kSpec, nullptr, nullptr), FJ_INVALID_ARGUMENT);
}

TEST(CApi, RolesHaveTheirSignatureNames) {
  EXPECT_STREQ(fj_role_name(FJ_ROLE_INPUT), "input");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_OUTPUT), "output");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_PARAM), "param");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_WORKSPACE), "workspace");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_GRAD_OUTPUT), "grad_output");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_GRAD_INPUT), "grad_input");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_GRAD_PARAM), "grad_param");
  EXPECT_STREQ(fj_role_name(FJ_ROLE_SAVED), "saved");
  EXPECT_EQ(fj_role_name(-1), nullptr);
  EXPECT_EQ(fj_role_name(FJ_ROLE_SAVED + 1), nullptr);
}

// The backward of kSpec: x and the parameters read, grad_y read, grad_x and a grad_ per parameter
// written, then the workspace; the same handle type, so every fj_chain_* accessor works on it.
TEST(CApi, CompileBackwardGivesTheGradientSignature) {
  fj_chain* chain = CompileBackwardOrDie(kSpec);
  ASSERT_NE(chain, nullptr);
  const char* spec = nullptr;
  ASSERT_EQ(fj_chain_spec(chain, &spec), FJ_OK);
  EXPECT_STREQ(spec, "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | swish | group_norm(groups=2,eps=1e-5)");
  const char* strategy = nullptr;
  ASSERT_EQ(fj_chain_strategy(chain, &strategy), FJ_OK);
  EXPECT_NE(std::string(strategy), "");
  const char* explain = nullptr;
  ASSERT_EQ(fj_chain_explain(chain, &explain), FJ_OK);
  EXPECT_NE(std::string(explain).find("grad_x f32[2,3,8,8,8] grad_input\n"), std::string::npos)
      << explain;

  size_t count = 0, workspace = 0;
  ASSERT_EQ(fj_chain_tensor_count(chain, &count), FJ_OK);
  ASSERT_EQ(fj_chain_workspace_bytes(chain, &workspace), FJ_OK);
  struct Expected {
    std::string name;
    int role;
    std::vector<int64_t> shape;
  };
  std::vector<Expected> expected = {
      {"x", FJ_ROLE_INPUT, {2, 3, 8, 8, 8}},
      {"0.weight", FJ_ROLE_PARAM, {8, 3, 3, 3, 3}},
      {"0.bias", FJ_ROLE_PARAM, {8}},
      {"2.weight", FJ_ROLE_PARAM, {8}},
      {"2.bias", FJ_ROLE_PARAM, {8}},
      {"grad_y", FJ_ROLE_GRAD_OUTPUT, {2, 8, 6, 6, 6}},
      {"grad_x", FJ_ROLE_GRAD_INPUT, {2, 3, 8, 8, 8}},
      {"grad_0.weight", FJ_ROLE_GRAD_PARAM, {8, 3, 3, 3, 3}},
      {"grad_0.bias", FJ_ROLE_GRAD_PARAM, {8}},
      {"grad_2.weight", FJ_ROLE_GRAD_PARAM, {8}},
      {"grad_2.bias", FJ_ROLE_GRAD_PARAM, {8}},
  };
  ASSERT_GT(workspace, 0u);  // this plan keeps u and grad_u there
  expected.push_back({"workspace", FJ_ROLE_WORKSPACE, {static_cast<int64_t>(workspace)}});
  ASSERT_EQ(count, expected.size());
  for (size_t i = 0; i < count; ++i) {
    fj_tensor_info t;
    ASSERT_EQ(fj_chain_tensor(chain, i, &t), FJ_OK);
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, expected[i].name);
    EXPECT_EQ(t.role, expected[i].role) << fj_role_name(t.role);
    ASSERT_EQ(t.ndim, static_cast<int>(expected[i].shape.size()));
    for (int d = 0; d < t.ndim; ++d) EXPECT_EQ(t.shape[d], expected[i].shape[d]) << d;
    if (t.role == FJ_ROLE_WORKSPACE) {
      EXPECT_EQ(t.bytes, workspace);
      EXPECT_EQ(t.alignment, 256u);
    } else {
      EXPECT_EQ(t.dtype, FJ_DTYPE_F32);
      size_t elements = 1;
      for (int d = 0; d < t.ndim; ++d) elements *= static_cast<size_t>(t.shape[d]);
      EXPECT_EQ(t.bytes, elements * 4);
      EXPECT_EQ(t.alignment, 16u);
    }
  }

  // Runs are checked against this signature before any driver is needed.
  const fj_deviceptr p = 0x10000;
  std::vector<fj_deviceptr> ptrs(count, p);
  EXPECT_EQ(fj_chain_run_tensors(chain, ptrs.data(), count - 1, nullptr, 0), FJ_INVALID_ARGUMENT);
  ptrs[6] = 0;  // grad_x
  EXPECT_EQ(fj_chain_run_tensors(chain, ptrs.data(), count, nullptr, 0), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("grad_x (grad_input) f32[2,3,8,8,8] is null"),
            std::string::npos)
      << fj_last_error();
  {
    const char* names[] = {"x", "0.weight", "0.bias", "2.weight", "2.bias", "grad_y", "grad_x"};
    const fj_deviceptr named[] = {p, p, p, p, p, p, p};
    EXPECT_EQ(fj_chain_run(chain, names, named, 7, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error())
                  .find("grad_0.weight (grad_param) f32[8,3,3,3,3] is missing"),
              std::string::npos)
        << fj_last_error();
  }
  EXPECT_EQ(fj_chain_release(chain), FJ_OK);
  EXPECT_EQ(fj_chain_release(chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("fj_compile_backward"), std::string::npos);
}

TEST(CApi, CompileBackwardOfAChainWithoutProducerOrBias) {
  fj_chain* chain = CompileBackwardOrDie(
      "x:f32[2,8,4,5,6] | group_norm(groups=4) | mean(dims=[2,3,4])");
  ASSERT_NE(chain, nullptr);
  size_t count = 0;
  ASSERT_EQ(fj_chain_tensor_count(chain, &count), FJ_OK);
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    fj_tensor_info t;
    ASSERT_EQ(fj_chain_tensor(chain, i, &t), FJ_OK);
    names.push_back(t.name);
    if (names.back() == "grad_y") {
      ASSERT_EQ(t.ndim, 2);  // the output's shape
      EXPECT_EQ(t.shape[0], 2);
      EXPECT_EQ(t.shape[1], 8);
    }
  }
  std::vector<std::string> expected = {"x", "0.weight", "0.bias", "grad_y", "grad_x",
                                       "grad_0.weight", "grad_0.bias"};
  size_t workspace = 0;
  ASSERT_EQ(fj_chain_workspace_bytes(chain, &workspace), FJ_OK);
  if (workspace > 0) expected.push_back("workspace");
  EXPECT_EQ(names, expected);
  EXPECT_EQ(fj_chain_release(chain), FJ_OK);
}

// bf16 and f16 chains, forward and backward: every tensor of the signature in the chain's dtype,
// its bytes at 2 per element.
TEST(CApi, LowPrecisionChainsHaveTheirDTypeInTheSignature) {
  for (const auto& [spec, dtype] :
       {std::pair{"x:bf16[2,3,8,8,8] | conv3d(out=4,k=3) | relu | group_norm(groups=2)",
                  FJ_DTYPE_BF16},
        std::pair{"x:f16[2,4,6,6,6] | group_norm(groups=2) | swish", FJ_DTYPE_F16}}) {
    for (bool backward : {false, true}) {
      fj_chain* chain = backward ? CompileBackwardOrDie(spec) : CompileOrDie(spec);
      ASSERT_NE(chain, nullptr) << spec;
      size_t count = 0;
      ASSERT_EQ(fj_chain_tensor_count(chain, &count), FJ_OK);
      for (size_t i = 0; i < count; ++i) {
        fj_tensor_info t;
        ASSERT_EQ(fj_chain_tensor(chain, i, &t), FJ_OK);
        if (t.role == FJ_ROLE_WORKSPACE) continue;
        EXPECT_EQ(t.dtype, dtype) << spec << " " << t.name;
        size_t elements = 1;
        for (int d = 0; d < t.ndim; ++d) elements *= static_cast<size_t>(t.shape[d]);
        EXPECT_EQ(t.bytes, elements * 2) << spec << " " << t.name;
      }
      EXPECT_EQ(fj_chain_release(chain), FJ_OK);
    }
  }
}

TEST(CApi, CompileBackwardErrorsSayWhatWasWrong) {
  fj_compile_options o = Sm90();
  fj_chain* chain = reinterpret_cast<fj_chain*>(0x1);
  EXPECT_EQ(fj_compile_backward("x:f32[2,3,8,8,8] | conv3d(out=8,k=3,strde=2)", &o, &chain),
            FJ_INVALID_ARGUMENT);
  EXPECT_EQ(chain, nullptr);
  EXPECT_NE(std::string(fj_last_error()).find("strde"), std::string::npos) << fj_last_error();

  EXPECT_EQ(fj_compile_backward("x:f64[2,3,8,8,8] | conv3d(out=8,k=3) | relu", &o, &chain),
            FJ_UNIMPLEMENTED);
  EXPECT_EQ(chain, nullptr);
  EXPECT_NE(std::string(fj_last_error()).find("f64"), std::string::npos) << fj_last_error();
  EXPECT_NE(std::string(fj_last_error()).find("f32"), std::string::npos) << fj_last_error();

  // output_padding >= stride (dilation allows it) has a backward too: its data gradient runs on
  // a longer grid and is cropped.
  const char* wide_padding =
      "x:f32[1,4,5,5,5] | conv_transpose3d(out=4,k=3,stride=1,dilation=2,output_padding=1) | relu";
  fj_chain* backward = nullptr;
  EXPECT_EQ(fj_compile_backward(wide_padding, &o, &backward), FJ_OK) << fj_last_error();
  EXPECT_EQ(fj_chain_release(backward), FJ_OK);

  o.strategy = "elementwise";  // names a forward plan
  EXPECT_EQ(fj_compile_backward("x:f32[2,3,8,8,8] | relu", &o, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("strategy"), std::string::npos) << fj_last_error();

  o = Sm90();
  o.precision = "fp16";
  EXPECT_EQ(fj_compile_backward(kSpec, &o, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("fj_compile_backward: precision 'fp16'"),
            std::string::npos)
      << fj_last_error();
  o = Sm90();
  o.struct_size = 3;
  EXPECT_EQ(fj_compile_backward(kSpec, &o, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("struct_size"), std::string::npos);
  EXPECT_EQ(fj_compile_backward(nullptr, nullptr, &chain), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("fj_compile_backward: spec is NULL"),
            std::string::npos);
  EXPECT_EQ(fj_compile_backward(kSpec, nullptr, nullptr), FJ_INVALID_ARGUMENT);
}

TEST(CApi, MisusedHandlesAreRefused) {
  const char* s = nullptr;
  size_t n = 0;
  EXPECT_EQ(fj_chain_spec(nullptr, &s), FJ_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fj_last_error()).find("NULL"), std::string::npos);
  EXPECT_EQ(fj_chain_release(nullptr), FJ_INVALID_ARGUMENT);
  int not_a_chain = 0;
  EXPECT_EQ(fj_chain_tensor_count(reinterpret_cast<fj_chain*>(&not_a_chain), &n),
            FJ_INVALID_ARGUMENT);

  fj_chain* chain = CompileOrDie(kSpec);
  EXPECT_EQ(fj_chain_spec(chain, nullptr), FJ_INVALID_ARGUMENT);
  EXPECT_EQ(fj_chain_release(chain), FJ_OK);
  EXPECT_EQ(fj_chain_release(chain), FJ_INVALID_ARGUMENT);  // double release: refused
  EXPECT_NE(std::string(fj_last_error()).find("released already"), std::string::npos);
  EXPECT_EQ(fj_chain_spec(chain, &s), FJ_INVALID_ARGUMENT);  // use after release: refused
}

TEST(CApi, RunChecksBindingsByName) {
  fj_chain* chain = CompileOrDie("x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | relu");
  const fj_deviceptr p = 0x10000;
  {
    const char* names[] = {"x", "0.weight", "0.bias", "y", "bogus"};
    const fj_deviceptr ptrs[] = {p, p, p, p, p};
    EXPECT_EQ(fj_chain_run(chain, names, ptrs, 5, nullptr, 0), FJ_INVALID_ARGUMENT);
    const std::string e = fj_last_error();
    EXPECT_NE(e.find("unknown tensor 'bogus'"), std::string::npos) << e;
    EXPECT_NE(e.find("x, 0.weight, 0.bias, y"), std::string::npos) << e;
  }
  {
    const char* names[] = {"x", "0.weight", "y"};
    const fj_deviceptr ptrs[] = {p, p, p};
    EXPECT_EQ(fj_chain_run(chain, names, ptrs, 3, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error()).find("0.bias (param) f32[8] is missing"), std::string::npos)
        << fj_last_error();
  }
  {
    const char* names[] = {"x", "0.weight", "0.bias", "y"};
    const fj_deviceptr ptrs[] = {p, p + 4, p, p};
    EXPECT_EQ(fj_chain_run(chain, names, ptrs, 4, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error()).find("0.weight (param) f32[8,3,3,3,3] must be 16-byte aligned"),
              std::string::npos)
        << fj_last_error();
  }
  {
    const char* names[] = {"x", "0.weight", "0.bias", "y"};
    const fj_deviceptr ptrs[] = {p, p, 0, p};
    EXPECT_EQ(fj_chain_run(chain, names, ptrs, 4, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error()).find("0.bias (param) f32[8] is null"), std::string::npos);
  }
  {
    const char* names[] = {"x", "x"};
    const fj_deviceptr ptrs[] = {p, p};
    EXPECT_EQ(fj_chain_run(chain, names, ptrs, 2, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error()).find("bound twice"), std::string::npos);
  }
  EXPECT_EQ(fj_chain_run(chain, nullptr, nullptr, 1, nullptr, 0), FJ_INVALID_ARGUMENT);
  {  // in signature order: x, 0.weight, 0.bias, y
    const fj_deviceptr ptrs[] = {p, p, p, p};
    EXPECT_EQ(fj_chain_run_tensors(chain, ptrs, 3, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error()).find("3 pointers for the 4 tensors"), std::string::npos)
        << fj_last_error();
    const fj_deviceptr null_bias[] = {p, p, 0, p};
    EXPECT_EQ(fj_chain_run_tensors(chain, null_bias, 4, nullptr, 0), FJ_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fj_last_error()).find("0.bias (param) f32[8] is null"),
              std::string::npos);
    EXPECT_EQ(fj_chain_run_tensors(chain, nullptr, 4, nullptr, 0), FJ_INVALID_ARGUMENT);
  }
  EXPECT_EQ(fj_chain_release(chain), FJ_OK);
}

TEST(CApi, ThreadsCompileAndQueryConcurrentlyWithTheirOwnErrors) {
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &ok] {
      fj_compile_options o = Sm90();
      fj_chain* chain = nullptr;
      const std::string spec = "x:f32[" + std::to_string(1 + t % 2) + ",3,8,8,8] | relu";
      if (fj_compile(spec.c_str(), &o, &chain) != FJ_OK) return;
      // A failing call on this thread sets only this thread's error.
      if (fj_compile("x:f32[1] | relu", &o, nullptr) != FJ_INVALID_ARGUMENT) return;
      const char* s = nullptr;
      if (fj_chain_spec(chain, &s) != FJ_OK || std::string(s) != spec) return;
      if (std::string(fj_last_error()) != "") return;
      ok[t] = fj_chain_release(chain) == FJ_OK;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
}

// Minor 2: the training forward writes u (SAVED) after y; the backward reading it has u after
// grad_y; a chain with nothing to save gets the plain forward and a clear refusal of the backward.
TEST(CApi, TrainingForwardAndTheBackwardReadingItsSavedTensor) {
  const char* spec = "x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | relu | group_norm(groups=2)";
  fj_compile_options o = Sm90();
  fj_chain* fwd = nullptr;
  ASSERT_EQ(fj_compile_training_forward(spec, &o, &fwd), FJ_OK) << fj_last_error();
  std::vector<std::pair<std::string, int>> got;
  size_t n = 0;
  ASSERT_EQ(fj_chain_tensor_count(fwd, &n), FJ_OK);
  for (size_t i = 0; i < n; ++i) {
    fj_tensor_info info{};
    ASSERT_EQ(fj_chain_tensor(fwd, i, &info), FJ_OK);
    got.push_back({info.name, info.role});
  }
  std::vector<std::pair<std::string, int>> want = {
      {"x", FJ_ROLE_INPUT},        {"0.weight", FJ_ROLE_PARAM}, {"0.bias", FJ_ROLE_PARAM},
      {"2.weight", FJ_ROLE_PARAM}, {"2.bias", FJ_ROLE_PARAM},   {"y", FJ_ROLE_OUTPUT},
      {"u", FJ_ROLE_SAVED}};
  size_t ws = 0;
  ASSERT_EQ(fj_chain_workspace_bytes(fwd, &ws), FJ_OK);
  if (ws > 0) want.push_back({"workspace", FJ_ROLE_WORKSPACE});
  EXPECT_EQ(got, want);
  EXPECT_STREQ(fj_role_name(FJ_ROLE_SAVED), "saved");
  EXPECT_EQ(fj_chain_release(fwd), FJ_OK);

  fj_chain* bwd = nullptr;
  ASSERT_EQ(fj_compile_backward_saved(spec, &o, &bwd), FJ_OK) << fj_last_error();
  fj_tensor_info info{};
  ASSERT_EQ(fj_chain_tensor(bwd, 6, &info), FJ_OK);  // after x, 4 parameters, grad_y
  EXPECT_STREQ(info.name, "u");
  EXPECT_EQ(info.role, FJ_ROLE_SAVED);
  EXPECT_EQ(fj_chain_release(bwd), FJ_OK);

  fj_chain* none = nullptr;
  EXPECT_EQ(fj_compile_backward_saved("x:f32[2,3,8,8,8] | conv3d(out=4,k=3)", &o, &none),
            FJ_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(std::string(fj_last_error()).find("use CompileBackward"), std::string::npos)
      << fj_last_error();
}

// A bf16 chain's training forward (its own plan writing u) saves f32 tensors; the backward reading
// them has them after grad_y, f32, and everything else in bf16. W4's shape of chain also saves its
// channel moments.
TEST(CApi, Bf16TrainingForwardSavesF32Tensors) {
  const char* spec =
      "x:bf16[3,3,10,12,12] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])";
  fj_compile_options o = Sm90();
  for (int backward = 0; backward < 2; ++backward) {
    fj_chain* c = nullptr;
    ASSERT_EQ(backward ? fj_compile_backward_saved(spec, &o, &c)
                       : fj_compile_training_forward(spec, &o, &c),
              FJ_OK)
        << fj_last_error();
    size_t n = 0;
    ASSERT_EQ(fj_chain_tensor_count(c, &n), FJ_OK);
    std::vector<std::string> saved;
    for (size_t i = 0; i < n; ++i) {
      fj_tensor_info info{};
      ASSERT_EQ(fj_chain_tensor(c, i, &info), FJ_OK);
      if (info.role == FJ_ROLE_WORKSPACE) continue;
      if (info.role == FJ_ROLE_SAVED) saved.push_back(info.name);
      EXPECT_EQ(info.dtype, info.role == FJ_ROLE_SAVED ? FJ_DTYPE_F32 : FJ_DTYPE_BF16) << info.name;
    }
    EXPECT_EQ(saved, (std::vector<std::string>{"u", "moments"})) << backward;
    EXPECT_EQ(fj_chain_release(c), FJ_OK);
  }
}

}  // namespace
