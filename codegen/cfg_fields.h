// codegen/cfg_fields.h: the chain constants of the generated `struct Cfg`, described once.
//
// Every template reads its chain through a Cfg parameter (Cfg::kN, Cfg::kKD, Cfg::kEps, ...). The
// emitter (codegen/emit.cc) writes a generated source's Cfg from this list, with the chain's
// values; templates/default_config.cuh declares the same fields with default values so that each
// template compiles on its own. tests/codegen/cfg_fields_test.cc checks that file against this
// list, field by field (name, type, order), so the two cannot drift.
//
// Besides these fields a Cfg has `using Elem` (bf16/f16 chains), pre()/post() (the chain's
// elementwise ops) and, for backward plans, pre_d()/post_d().
#ifndef FUSEJIT_CODEGEN_CFG_FIELDS_H_
#define FUSEJIT_CODEGEN_CFG_FIELDS_H_

#include <span>
#include <string>
#include <string_view>

#include "codegen/chain_info.h"
#include "fusejit/chain.h"

namespace fusejit::codegen {

enum class CfgType {
  kInt,
  kBool,
  kReal,  // float (double in f64 chains)
};

struct CfgField {
  CfgType type;
  std::string_view name;  // "kCin"
  // Declared on the previous field's line ("static constexpr int kCin = 3, kDin = 8, ...").
  bool same_line;
  // Its value for a chain as C++ literal text ("3", "true", "1e-05f", "kConv3d").
  // REQUIRES: info == AnalyzeChain(chain).
  std::string (*value)(const Chain& chain, const ChainInfo& info);
};

// The fields, in declaration order.
std::span<const CfgField> ChainCfgFields();

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_CFG_FIELDS_H_
