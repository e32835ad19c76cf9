#include "codegen/cast_plan.h"

#include "absl/strings/str_cat.h"
#include "codegen/dtype_table.h"
#include "codegen/strategy_util.h"

namespace fusejit::codegen {

Plan PlanCasts(const std::vector<Cast>& casts, const PlanTarget& target, const std::string& what) {
  Plan plan;
  plan.strategy = "cast";
  plan.description = what;
  plan.includes = {"cast.cuh"};
  for (size_t i = 0; i < casts.size(); ++i) {
    const Cast& c = casts[i];
    plan.signature.push_back({c.from, TensorRole::kInput, c.from_dtype, {c.elements}, 16});
    plan.signature.push_back({c.to, TensorRole::kOutput, c.to_dtype, {c.elements}, 16});
    KernelLaunch k;
    k.symbol = absl::StrCat("fj_cast", i);
    k.body = absl::StrCat("fj::cast_kernel<", DeviceTypeName(c.from_dtype), ", ",
                          DeviceTypeName(c.to_dtype), ", ", c.elements, "LL>");
    k.purpose = absl::StrCat(c.from, " (", DTypeName(c.from_dtype), ") -> ", c.to, " (",
                             DTypeName(c.to_dtype), "), ", c.elements, " elements");
    // 8 elements per thread and step; at most 8 blocks per SM (a grid-stride loop covers the rest).
    k.grid = {GridStrideBlocks(CeilDiv(c.elements, 8), target), 1, 1};
    k.block = {256, 1, 1};
    k.args = {KernelArg::Tensor("in", c.from, KernelArg::Access::kRead),
              KernelArg::Tensor("out", c.to, KernelArg::Access::kWrite)};
    plan.kernels.push_back(std::move(k));
  }
  return plan;
}

Plan PlanCrop(const std::string& from, const Shape& from_shape, const std::string& to,
              const Shape& to_shape, DType dtype, const PlanTarget& target) {
  Plan plan;
  plan.strategy = "crop";
  plan.description = absl::StrCat("the leading ", FormatShape(to_shape), " box of ",
                                  FormatShape(from_shape));
  plan.includes = {"cast.cuh"};
  plan.signature.push_back({from, TensorRole::kInput, dtype, from_shape, 16});
  plan.signature.push_back({to, TensorRole::kOutput, dtype, to_shape, 16});
  KernelLaunch k;
  k.symbol = "fj_crop";
  k.body = absl::StrCat("fj::crop_kernel<", DeviceTypeName(dtype), ", ",
                        to_shape[0] * to_shape[1], "LL, ", from_shape[2], ", ", from_shape[3],
                        ", ", from_shape[4], ", ", to_shape[2], ", ", to_shape[3], ", ",
                        to_shape[4], ">");
  k.purpose = absl::StrCat(from, " ", FormatShape(from_shape), " -> its leading box ", to, " ",
                           FormatShape(to_shape));
  k.grid = {GridStrideBlocks(NumElements(to_shape), target), 1, 1};
  k.block = {256, 1, 1};
  k.args = {KernelArg::Tensor("in", from, KernelArg::Access::kRead),
            KernelArg::Tensor("out", to, KernelArg::Access::kWrite)};
  plan.kernels.push_back(std::move(k));
  return plan;
}

}  // namespace fusejit::codegen
