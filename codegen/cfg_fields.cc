#include "codegen/cfg_fields.h"

#include "absl/strings/str_cat.h"
#include "codegen/format_number.h"

namespace fusejit::codegen {

namespace {

constexpr CfgType kInt = CfgType::kInt;
constexpr CfgField kFields[] = {
    // input x [kN, kCin, kDin, kHin, kWin]
    {kInt, "kN"},
    {kInt, "kCin"}, {kInt, "kDin", true}, {kInt, "kHin", true}, {kInt, "kWin", true},
    // the producer's output [kN, kC, kD, kH, kW]: what the elementwise ops and group_norm see
    {kInt, "kC"}, {kInt, "kD", true}, {kInt, "kH", true}, {kInt, "kW", true},
    // the producer: kNoProducer, kConv3d or kConvTranspose3d, and its attributes per (d, h, w)
    {kInt, "kProducer"},
    {kInt, "kKD"}, {kInt, "kKH", true}, {kInt, "kKW", true},
    {kInt, "kSD"}, {kInt, "kSH", true}, {kInt, "kSW", true},
    {kInt, "kPD"}, {kInt, "kPH", true}, {kInt, "kPW", true},
    {kInt, "kDilD"}, {kInt, "kDilH", true}, {kInt, "kDilW", true},
    {kInt, "kOPD"}, {kInt, "kOPH", true}, {kInt, "kOPW", true},
    {CfgType::kBool, "kBias"},
    // group_norm (kGroups == 0 without one), then the mean mode (kNoMean, kMeanSpatial, kMeanAll)
    {kInt, "kGroups"},
    {CfgType::kReal, "kEps"},
    {kInt, "kMean"},
};

}  // namespace

std::span<const CfgField> ChainCfgFields() { return kFields; }

std::string ChainCfgValue(std::string_view name, const Chain& chain, const ChainInfo& info) {
  const Shape& x = chain.input;
  const Shape& p = info.producer_shape;
  ConvAttrs conv;  // defaults describe "no producer"
  conv.kernel = {1, 1, 1};
  if (info.producer) conv = info.producer->conv;
  const auto dim = [](std::string_view n, std::string_view prefix, const Dims3& d) -> int64_t {
    const std::string_view axis = n.substr(prefix.size());
    return axis == "D" ? d[0] : axis == "H" ? d[1] : d[2];
  };
  if (name == "kN") return absl::StrCat(x[0]);
  if (name == "kCin") return absl::StrCat(x[1]);
  if (name == "kDin") return absl::StrCat(x[2]);
  if (name == "kHin") return absl::StrCat(x[3]);
  if (name == "kWin") return absl::StrCat(x[4]);
  if (name == "kC") return absl::StrCat(p[1]);
  if (name == "kD") return absl::StrCat(p[2]);
  if (name == "kH") return absl::StrCat(p[3]);
  if (name == "kW") return absl::StrCat(p[4]);
  if (name == "kProducer") {
    if (!info.producer) return "kNoProducer";
    return info.producer->kind == OpKind::kConv3d ? "kConv3d" : "kConvTranspose3d";
  }
  if (name.starts_with("kDil")) return absl::StrCat(dim(name, "kDil", conv.dilation));
  if (name.starts_with("kOP")) return absl::StrCat(dim(name, "kOP", conv.output_padding));
  if (name.starts_with("kK")) return absl::StrCat(dim(name, "kK", conv.kernel));
  if (name.starts_with("kS")) return absl::StrCat(dim(name, "kS", conv.stride));
  if (name.starts_with("kP")) return absl::StrCat(dim(name, "kP", conv.padding));
  if (name == "kBias") return info.producer && conv.bias ? "true" : "false";
  if (name == "kGroups") return absl::StrCat(info.group_norm ? info.group_norm->groups : 0);
  if (name == "kEps") return RealLiteral(info.group_norm ? info.group_norm->eps : 1e-5, chain.dtype);
  if (name == "kMean") {
    static constexpr const char* kMeanNames[] = {"kNoMean", "kMeanSpatial", "kMeanAll"};
    return kMeanNames[static_cast<int>(info.mean)];
  }
  return "";
}

}  // namespace fusejit::codegen
