// codegen/op_table.h: every op of the chain grammar, described once.
//
// One OpDesc per OpKind: its spec name (and accepted alias), what it is in a chain (producer,
// elementwise, group_norm, mean), its arguments' names, and for elementwise ops the three things
// the rest of fusejit needs of them: the device statement the emitter writes, the float64 value the
// CPU reference computes, and the float64 derivative (PyTorch's conventions at the kinks) for the
// backward pass and its reference. The spec parser, the printer (OpName), the emitter
// (codegen/emit.cc) and the reference (reference/ops.cc) read this table; adding an elementwise op
// is a row here plus its device function in templates/common.cuh.
#ifndef FUSEJIT_CODEGEN_OP_TABLE_H_
#define FUSEJIT_CODEGEN_OP_TABLE_H_

#include <string>
#include <string_view>
#include <vector>

#include "fusejit/chain.h"

namespace fusejit {

enum class OpRole { kProducer, kElementwise, kGroupNorm, kMean };

struct OpArgDesc {
  const char* name;   // canonical spelling, as printed
  const char* alias;  // another accepted spelling (giving both is an error), or nullptr
};

struct OpDesc {
  OpKind kind;
  const char* name;   // spec name, as printed
  const char* alias;  // another accepted spec name ("silu"), printed as `name`; or nullptr
  OpRole role;
  std::vector<OpArgDesc> args;  // every argument it takes, in printing order
  // Elementwise ops only (nullptr otherwise):
  // Statement on `v` (float; double in f64 chains, whose literals are double): "v = fj::relu(v);"
  std::string (*device)(const Op& op, DType dtype);
  double (*value)(const Op& op, double x);           // float64 f(x), PyTorch's semantics
  double (*derivative)(const Op& op, double x);      // float64 f'(x), PyTorch's at the kinks
  // Statement on `float v` setting `float g` to f'(v) on the device, the same kinks as
  // `derivative`: "g = fj::relu_d(v);" (the backward templates, through Cfg::pre_d / post_d).
  std::string (*device_derivative)(const Op& op) = nullptr;
};

// Every op, in OpKind order.
const std::vector<OpDesc>& OpTable();
const OpDesc& Describe(OpKind kind);
// The op spelled `name` (its name or alias); nullptr when there is none.
const OpDesc* FindOp(std::string_view name);
// "conv3d, conv_transpose3d, relu, ..., swish (silu), ...": the ops for error messages.
std::string OpNamesText();

}  // namespace fusejit

#endif  // FUSEJIT_CODEGEN_OP_TABLE_H_
