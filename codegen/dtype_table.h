// codegen/dtype_table.h: how each chain dtype is spelled in generated sources -- the one place
// codegen names C++ types for tensors (workspace types: codegen/plan.h ArgTypeName).
#ifndef FUSEJIT_CODEGEN_DTYPE_TABLE_H_
#define FUSEJIT_CODEGEN_DTYPE_TABLE_H_

#include "fusejit/chain.h"

namespace fusejit::codegen {

// One stored element of `dtype` (x, parameters, y): "float", "double", "fj::bf16_t",
// "fj::f16_t" (templates/dtype.cuh).
const char* DeviceTypeName(DType dtype);

// The arithmetic type of a chain of `dtype` (its ops, statistics and Cfg::kEps): "double" for
// f64 chains, "float" for the others (bf16/f16 compute in fp32; templates/dtype.cuh AccT).
const char* ComputeTypeName(DType dtype);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_DTYPE_TABLE_H_
