#include <random>
#include "tools/tensor_files.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "reference/npy.h"

namespace fusejit::tools {

absl::StatusOr<TensorFiles> ParseTensorFlags(const ParsedArgs& parsed, const Chain& chain) {
  TensorFiles result;
  if (auto input = parsed.Get("input")) result.files["x"] = *input;
  const std::vector<ParamSpec> params = ChainParams(chain);
  std::vector<std::string> names;
  for (const ParamSpec& p : params) names.push_back(p.name);
  for (const std::string& value : parsed.GetAll("param")) {
    const size_t eq = value.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == value.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--param '", value, "': expected NAME=FILE.npy, e.g. 0.weight=w.npy"));
    }
    const std::string name = value.substr(0, eq);
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--param ", name, ": the chain has no parameter of that name; its parameters: ",
          names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
    }
    if (!result.files.emplace(name, value.substr(eq + 1)).second) {
      return absl::InvalidArgumentError(absl::StrCat("--param ", name, " is given twice"));
    }
  }
  return result;
}

absl::Status ReadTensorFiles(const TensorFiles& files, const Chain& chain, HostInputs& inputs) {
  std::map<std::string, Shape> expected = {{"x", chain.input}};
  for (const ParamSpec& p : ChainParams(chain)) expected[p.name] = p.shape;
  for (const auto& [name, path] : files.files) {
    const std::string flag = name == "x" ? "--input" : absl::StrCat("--param ", name);
    absl::StatusOr<HostTensor> t = ReadNpy(path);
    if (!t.ok())
      return absl::Status(t.status().code(), absl::StrCat(flag, ": ", t.status().message()));
    if (t->shape != expected[name]) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", path, " has shape ", FormatShape(t->shape), " but ", name,
                       " must have shape ", FormatShape(expected[name])));
    }
    // A bf16/f16 chain runs on the dtype's values: round them here, so that the reference (and
    // --check) sees what the GPU gets.
    for (float& v : t->data) v = RoundToDType(v, chain.dtype);
    if (name == "x") {
      inputs.x = *std::move(t);
    } else {
      inputs.params[name] = *std::move(t);
    }
  }
  return absl::OkStatus();
}

HostInputs InputsWith(const Chain& chain, uint64_t seed, HostInputs given) {
  HostInputs inputs = RandomInputs(chain, seed);
  if (!given.x.shape.empty()) inputs.x = std::move(given.x);
  for (auto& [name, t] : given.params) inputs.params[name] = std::move(t);
  return inputs;
}

HostTensor RandomGradOutput(const Chain& chain, uint64_t seed) {
  HostTensor g;
  g.shape = OutputShape(chain);
  g.data.resize(NumElements(g.shape));
  std::mt19937_64 rng(seed ^ 0x677261645f79ull);
  for (float& v : g.data) {
    v = RoundToDType(static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-52 - 1.0),
                     chain.dtype);
  }
  return g;
}

}  // namespace fusejit::tools
