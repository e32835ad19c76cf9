#include "codegen/emit.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "codegen/cfg_fields.h"
#include "codegen/chain_info.h"
#include "codegen/dtype_table.h"
#include "codegen/format_number.h"
#include "codegen/op_table.h"
#include "fusejit/fusejit.h"
#include "templates/embedded.h"

namespace fusejit::codegen {
namespace {

// `float NAME(float v)` (double for f64 chains): the ops applied in order.
std::string OpsFunction(const char* name, const std::vector<const Op*>& ops, DType dtype) {
  std::vector<std::string> names;
  std::string body;
  for (const Op* op : ops) {
    names.emplace_back(OpName(op->kind));
    absl::StrAppend(&body, " ", Describe(op->kind).device(*op, dtype));
  }
  const char* real = ComputeTypeName(dtype);
  return absl::StrCat("  // ", names.empty() ? "(none)" : absl::StrJoin(names, ", "), "\n",
                      "  __device__ static ", real, " ", name, "(", real, " v) {", body,
                      " return v; }\n");
}

// `float NAME(float v, float& d)`: the ops' value at v, and in d the product of their derivatives
// (the chain rule through them), for the backward templates. REQUIRES: an f32 chain (the backward
// plans are f32's; bf16/f16 run them between casts, f64 has none).
std::string OpsDerivativeFunction(const char* name, const std::vector<const Op*>& ops) {
  const char* real = ComputeTypeName(DType::kF32);
  std::string body;
  for (const Op* op : ops) {
    absl::StrAppend(&body, " { ", real, " g; ", Describe(op->kind).device_derivative(*op), " ",
                    Describe(op->kind).device(*op, DType::kF32), " d *= g; }");
  }
  return absl::StrCat("  __device__ static ", real, " ", name, "(", real, " v, ", real,
                      "& d) { d = 1.f;", body, " return v; }\n");
}

std::string ConfigStruct(const Chain& chain, const Plan& plan) {
  const ChainInfo info = AnalyzeChain(chain);
  std::string s = "struct Cfg {\n";
  if (chain.dtype != DType::kF32) {  // f32 is the templates' default element type (ElemT)
    absl::StrAppend(&s, "  using Elem = ", DeviceTypeName(chain.dtype), ";  // x, parameters, y\n");
  }
  // The chain's constants (codegen/cfg_fields.h), one declaration per line of fields.
  const std::span<const CfgField> fields = ChainCfgFields();
  for (size_t i = 0; i < fields.size(); ++i) {
    const CfgField& f = fields[i];
    if (f.name == "kN") absl::StrAppend(&s, "  // input x", FormatShape(chain.input), "\n");
    if (f.name == "kC") {
      absl::StrAppend(&s, "  // producer output ", FormatShape(info.producer_shape),
                      ": what the elementwise ops and group_norm see\n");
    }
    if (!f.same_line) {
      const char* type = f.type == CfgType::kInt    ? "int"
                         : f.type == CfgType::kBool ? "bool"
                                                    : ComputeTypeName(chain.dtype);
      absl::StrAppend(&s, "  static constexpr ", type, " ");
    } else {
      absl::StrAppend(&s, ", ");
    }
    absl::StrAppend(&s, std::string(f.name), " = ", f.value(chain, info));
    if (i + 1 == fields.size() || !fields[i + 1].same_line) absl::StrAppend(&s, ";\n");
  }
  absl::StrAppend(&s, OpsFunction("pre", info.pre_ops, chain.dtype));
  absl::StrAppend(&s, OpsFunction("post", info.post_ops, chain.dtype));
  if (plan.derivatives) {
    absl::StrAppend(&s, OpsDerivativeFunction("pre_d", info.pre_ops));
    absl::StrAppend(&s, OpsDerivativeFunction("post_d", info.post_ops));
  }
  absl::StrAppend(&s, "};\n");
  return s;
}

// The C++ element type an argument points to: its tensor's dtype or its workspace type.
std::string ElementType(const KernelArg& a, const Chain& chain, const Plan& plan) {
  if (a.type != ArgType::kTensorDType) return ArgTypeName(a.type);
  DType dtype = chain.dtype;  // x, y, the parameters, nulls
  if (a.kind == KernelArg::Kind::kTensor) {
    for (const TensorSpec& t : plan.signature) {
      if (t.name == a.param) dtype = t.dtype;
    }
  }
  return DeviceTypeName(dtype);
}

std::string Wrapper(const KernelLaunch& k, const Chain& chain, const Plan& plan) {
  std::vector<std::string> params, names;
  for (const KernelArg& a : k.args) {
    params.push_back(absl::StrCat(a.access == KernelArg::Access::kRead ? "const " : "",
                                  ElementType(a, chain, plan), "*",
                                  k.restrict_pointers ? " __restrict__ " : " ", a.name));
    names.push_back(a.name);
  }
  const unsigned threads = k.block[0] * k.block[1] * k.block[2];
  const std::string bounds = k.min_blocks_per_sm
                                 ? absl::StrCat(threads, ", ", k.min_blocks_per_sm)
                                 : absl::StrCat(threads);
  return absl::StrCat("// ", k.purpose, "\nextern \"C\" __global__ void __launch_bounds__(", bounds,
                      ") ", k.symbol, "(", absl::StrJoin(params, ", "),
                      ") {\n  fj::grid_dependency_begin();\n  ", k.body, "(",
                      absl::StrJoin(names, ", "), ");\n}\n");
}

std::string Commented(const std::string& text) {
  std::string s;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty()) absl::StrAppend(&s, "// ", line, "\n");
  }
  return s;
}

}  // namespace

std::vector<std::string> SourceNvrtcOptions() {
  // Templates may use lambdas and helpers without __device__; -lineinfo keeps profiles readable.
  return {"--device-as-default-execution-space", "-lineinfo"};
}

GeneratedSource EmitSource(const Chain& chain, const Plan& plan) {
  GeneratedSource out;
  out.nvrtc_options = SourceNvrtcOptions();
  out.name = absl::StrCat("fusejit_", plan.strategy, ".cu");
  std::string& s = out.main;
  absl::StrAppend(&s, "// Generated by fusejit ", GeneratorVersion(), ". Do not edit.\n");
  absl::StrAppend(&s, "// chain: ", FormatChain(chain), "\n");
  absl::StrAppend(&s, Commented(ExplainPlan(plan)), "\n");
  absl::StrAppend(&s, "#define FJ_GENERATED 1\n#include \"default_config.cuh\"\n\nnamespace fj {\n");
  absl::StrAppend(&s, ConfigStruct(chain, plan));
  for (const TuneStruct& t : plan.tunes) {
    absl::StrAppend(&s, "struct ", t.name, " {\n");
    for (const TuneStruct::Field& f : t.fields) {
      absl::StrAppend(&s, "  static constexpr ", f.type, " ", f.name, " = ", f.value, ";\n");
    }
    absl::StrAppend(&s, "};\n");
  }
  absl::StrAppend(&s, "}  // namespace fj\nusing fj::Cfg;\n");
  for (const TuneStruct& t : plan.tunes) absl::StrAppend(&s, "using fj::", t.name, ";\n");
  absl::StrAppend(&s, "\n");
  for (const std::string& inc : plan.includes) absl::StrAppend(&s, "#include \"", inc, "\"\n");
  absl::StrAppend(&s, "\n");
  for (const KernelLaunch& k : plan.kernels) absl::StrAppend(&s, Wrapper(k, chain, plan), "\n");
  for (const templates::TemplateFile& f : templates::All()) {
    out.headers.emplace_back(std::string(f.name), std::string(f.text));
  }
  return out;
}

}  // namespace fusejit::codegen
