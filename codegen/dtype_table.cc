#include "codegen/dtype_table.h"

namespace fusejit::codegen {

const char* DeviceTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float";
    case DType::kF64: return "double";
    case DType::kBF16: return "fj::bf16_t";
    case DType::kF16: return "fj::f16_t";
  }
  return "float";
}

const char* ComputeTypeName(DType dtype) { return dtype == DType::kF64 ? "double" : "float"; }

}  // namespace fusejit::codegen
