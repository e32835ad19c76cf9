#include "codegen/cfg_fields.h"

#include "absl/strings/str_cat.h"
#include "codegen/format_number.h"

namespace fusejit::codegen {

namespace {

// The producer's attributes; without a producer, a 1x1x1 kernel and the other defaults.
ConvAttrs Conv(const ChainInfo& info) {
  if (info.producer) return info.producer->conv;
  ConvAttrs none;
  none.kernel = {1, 1, 1};
  return none;
}

constexpr CfgType kInt = CfgType::kInt;
using C = const Chain&;
using I = const ChainInfo&;

// One line per field: type, name, whether it continues the previous declaration, value.
constexpr CfgField kFields[] = {
    // input x [kN, kCin, kDin, kHin, kWin]
    {kInt, "kN", false, [](C c, I) { return absl::StrCat(c.input[0]); }},
    {kInt, "kCin", false, [](C c, I) { return absl::StrCat(c.input[1]); }},
    {kInt, "kDin", true, [](C c, I) { return absl::StrCat(c.input[2]); }},
    {kInt, "kHin", true, [](C c, I) { return absl::StrCat(c.input[3]); }},
    {kInt, "kWin", true, [](C c, I) { return absl::StrCat(c.input[4]); }},
    // the producer's output [kN, kC, kD, kH, kW]: what the elementwise ops and group_norm see
    {kInt, "kC", false, [](C, I i) { return absl::StrCat(i.producer_shape[1]); }},
    {kInt, "kD", true, [](C, I i) { return absl::StrCat(i.producer_shape[2]); }},
    {kInt, "kH", true, [](C, I i) { return absl::StrCat(i.producer_shape[3]); }},
    {kInt, "kW", true, [](C, I i) { return absl::StrCat(i.producer_shape[4]); }},
    // the producer (kNoProducer, kConv3d, kConvTranspose3d) and its attributes per (d, h, w)
    {kInt, "kProducer", false,
     [](C, I i) -> std::string {
       if (!i.producer) return "kNoProducer";
       return i.producer->kind == OpKind::kConv3d ? "kConv3d" : "kConvTranspose3d";
     }},
    {kInt, "kKD", false, [](C, I i) { return absl::StrCat(Conv(i).kernel[0]); }},
    {kInt, "kKH", true, [](C, I i) { return absl::StrCat(Conv(i).kernel[1]); }},
    {kInt, "kKW", true, [](C, I i) { return absl::StrCat(Conv(i).kernel[2]); }},
    {kInt, "kSD", false, [](C, I i) { return absl::StrCat(Conv(i).stride[0]); }},
    {kInt, "kSH", true, [](C, I i) { return absl::StrCat(Conv(i).stride[1]); }},
    {kInt, "kSW", true, [](C, I i) { return absl::StrCat(Conv(i).stride[2]); }},
    {kInt, "kPD", false, [](C, I i) { return absl::StrCat(Conv(i).padding[0]); }},
    {kInt, "kPH", true, [](C, I i) { return absl::StrCat(Conv(i).padding[1]); }},
    {kInt, "kPW", true, [](C, I i) { return absl::StrCat(Conv(i).padding[2]); }},
    {kInt, "kDilD", false, [](C, I i) { return absl::StrCat(Conv(i).dilation[0]); }},
    {kInt, "kDilH", true, [](C, I i) { return absl::StrCat(Conv(i).dilation[1]); }},
    {kInt, "kDilW", true, [](C, I i) { return absl::StrCat(Conv(i).dilation[2]); }},
    {kInt, "kOPD", false, [](C, I i) { return absl::StrCat(Conv(i).output_padding[0]); }},
    {kInt, "kOPH", true, [](C, I i) { return absl::StrCat(Conv(i).output_padding[1]); }},
    {kInt, "kOPW", true, [](C, I i) { return absl::StrCat(Conv(i).output_padding[2]); }},
    {CfgType::kBool, "kBias", false,
     [](C, I i) -> std::string { return i.producer && Conv(i).bias ? "true" : "false"; }},
    // group_norm (kGroups == 0 without one), then the mean mode (kNoMean, kMeanSpatial, kMeanAll)
    {kInt, "kGroups", false,
     [](C, I i) { return absl::StrCat(i.group_norm ? i.group_norm->groups : 0); }},
    {CfgType::kReal, "kEps", false,
     [](C c, I i) { return RealLiteral(i.group_norm ? i.group_norm->eps : 1e-5, c.dtype); }},
    {kInt, "kMean", false,
     [](C, I i) -> std::string {
       static constexpr const char* kNames[] = {"kNoMean", "kMeanSpatial", "kMeanAll"};
       return kNames[static_cast<int>(i.mean)];
     }},
};

}  // namespace

std::span<const CfgField> ChainCfgFields() { return kFields; }

}  // namespace fusejit::codegen
