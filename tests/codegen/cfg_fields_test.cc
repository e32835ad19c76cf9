// tests/cfg_fields_test.cc: templates/default_config.cuh declares exactly the chain fields
// codegen/cfg_fields.h lists (name, type, order), and every generated Cfg has them all.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "codegen/cfg_fields.h"
#include "codegen/emit.h"
#include "codegen/planner.h"
#include "fusejit/workloads.h"
#include "templates/embedded.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

using codegen::CfgType;

std::string TemplateText(std::string_view name) {
  for (const templates::TemplateFile& f : templates::All()) {
    if (f.name == name) return std::string(f.text);
  }
  ADD_FAILURE() << name << " is not an embedded template";
  return "";
}

// (type, name) of every `static constexpr TYPE kA = ..., kB = ...;` in `body`, in order.
std::vector<std::pair<std::string, std::string>> Declared(const std::string& body) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::regex decl(R"(static constexpr (\w+) ([^;]*);)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), decl); it != std::sregex_iterator();
       ++it) {
    const std::string type = (*it)[1];
    for (absl::string_view part : absl::StrSplit((*it)[2].str(), ',')) {
      const absl::string_view lhs = part.substr(0, part.find('='));
      out.emplace_back(type, std::string(absl::StripAsciiWhitespace(lhs)));
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Listed(const char* real) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const codegen::CfgField& f : codegen::ChainCfgFields()) {
    const char* type = f.type == CfgType::kInt ? "int" : f.type == CfgType::kBool ? "bool" : real;
    out.emplace_back(type, std::string(f.name));
  }
  return out;
}

TEST(CfgFields, DefaultConfigDeclaresTheListedFieldsInOrder) {
  const std::string text = TemplateText("default_config.cuh");
  const size_t begin = text.find("struct DefaultConfig {");
  ASSERT_NE(begin, std::string::npos);
  const size_t end = text.find("\n};", begin);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(Declared(text.substr(begin, end - begin)), Listed("float"));
}

TEST(CfgFields, GeneratedConfigsDeclareTheListedFieldsInOrder) {
  std::vector<Chain> chains;
  for (const Workload& w : SeedWorkloads()) chains.push_back(ParseOrFail(w.spec));
  chains.push_back(ParseOrFail("x:f64[2,4,6,6,6] | relu | group_norm(groups=2)"));
  chains.push_back(ParseOrFail("x:bf16[2,4,6,6,6] | conv_transpose3d(out=4,k=3,stride=2,"
                               "output_padding=1) | tanh"));
  Rng rng(7);
  for (int i = 0; i < 10; ++i) chains.push_back(RandomChain(rng));
  for (const Chain& chain : chains) {
    absl::StatusOr<codegen::Plan> plan =
        codegen::MakePlan(chain, {"sm_90", 132, Precision::kFp32});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string src = codegen::EmitSource(chain, *plan).main;
    const size_t begin = src.find("struct Cfg {");
    ASSERT_NE(begin, std::string::npos);
    const size_t end = src.find("\n};", begin);
    EXPECT_EQ(Declared(src.substr(begin, end - begin)),
              Listed(chain.dtype == DType::kF64 ? "double" : "float"))
        << FormatChain(chain);
  }
}

}  // namespace
}  // namespace fusejit
