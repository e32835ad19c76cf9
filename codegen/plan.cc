#include "codegen/plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusejit::codegen {

size_t Plan::AddWorkspace(std::string name, size_t bytes) {
  const size_t offset = workspace_bytes;
  workspace.push_back({std::move(name), offset, bytes});
  workspace_bytes += (bytes + 255) / 256 * 256;
  return offset;
}

const char* ArgTypeName(ArgType type) {
  switch (type) {
    case ArgType::kTensorDType: break;
    case ArgType::kFloat: return "float";
    case ArgType::kDouble: return "double";
    case ArgType::kFloat2: return "float2";
    case ArgType::kDouble2: return "double2";
    case ArgType::kInt: return "int";
    case ArgType::kBytes: return "unsigned char";
    case ArgType::kMoments: return "fj::Moments";
    case ArgType::kMomentsD: return "fj::MomentsD";
    case ArgType::kTcChannelMoments: return "fj::TcChannelMoments";
    case ArgType::kIgemmChannelMoments: return "fj::IgemmChannelMoments";
  }
  return "float";
}

KernelArg KernelArg::Input(std::string name) {
  return {Kind::kInput, std::move(name), "", 0, ArgType::kTensorDType, Access::kRead};
}
KernelArg KernelArg::Output(std::string name) {
  return {Kind::kOutput, std::move(name), "", 0, ArgType::kTensorDType, Access::kWrite};
}
KernelArg KernelArg::Param(std::string name, std::string param) {
  return {Kind::kParam, std::move(name), std::move(param), 0, ArgType::kTensorDType,
          Access::kRead};
}
KernelArg KernelArg::Tensor(std::string name, std::string tensor, Access access) {
  return {Kind::kTensor, std::move(name), std::move(tensor), 0, ArgType::kTensorDType, access};
}
KernelArg KernelArg::Workspace(ArgType type, std::string name, size_t offset, Access access) {
  return {Kind::kWorkspace, std::move(name), "", offset, type, access};
}
KernelArg KernelArg::Null(ArgType type, std::string name, Access access) {
  return {Kind::kParam, std::move(name), "", 0, type, access};
}

namespace {

std::string ArgText(const KernelArg& a) {
  switch (a.kind) {
    case KernelArg::Kind::kInput: return "x";
    case KernelArg::Kind::kOutput: return "y";
    case KernelArg::Kind::kParam:
    case KernelArg::Kind::kTensor: return a.param.empty() ? "null" : a.param;
    case KernelArg::Kind::kWorkspace: return absl::StrCat("ws+", a.offset);
  }
  return "?";
}

std::string Dim3Text(const std::array<unsigned, 3>& d) {
  return absl::StrCat("(", d[0], ",", d[1], ",", d[2], ")");
}

}  // namespace

std::string ExplainPlan(const Plan& plan) {
  std::string s = absl::StrCat("plan: ", plan.strategy, "\n  ", plan.description, "\n");
  if (!plan.tune_config.empty()) absl::StrAppend(&s, "  config: ", plan.tune_config, "\n");
  for (const TuneStruct& t : plan.tunes) {
    std::vector<std::string> fields;
    for (const TuneStruct::Field& f : t.fields) fields.push_back(f.name + "=" + f.value);
    absl::StrAppend(&s, "  tuning ", t.name, ": ", absl::StrJoin(fields, " "), "\n");
  }
  for (const ConstantCopy& c : plan.constant_copies) {
    absl::StrAppend(&s, "  copy ", c.param, " -> __constant__ ", c.symbol, " (", c.bytes,
                    " bytes)\n");
  }
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const KernelLaunch& k = plan.kernels[i];
    std::vector<std::string> args;
    for (const KernelArg& a : k.args) args.push_back(absl::StrCat(a.name, "=", ArgText(a)));
    absl::StrAppend(&s, "  kernel ", i, ": ", k.symbol, " grid", Dim3Text(k.grid), " block",
                    Dim3Text(k.block));
    if (k.shared_bytes) absl::StrAppend(&s, " shared=", k.shared_bytes);
    if (k.min_blocks_per_sm) absl::StrAppend(&s, " min_blocks/SM=", k.min_blocks_per_sm);
    absl::StrAppend(&s, "\n      ", k.purpose, "\n      args: ", absl::StrJoin(args, ", "), "\n");
  }
  absl::StrAppend(&s, "  workspace: ", plan.workspace_bytes, " bytes\n");
  for (const WorkspaceRegion& r : plan.workspace) {
    absl::StrAppend(&s, "    +", r.offset, " ", r.bytes, " bytes: ", r.name, "\n");
  }
  return s;
}

}  // namespace fusejit::codegen
