// codegen/format_number.h: exact, locale-independent number text for specs and generated source.
#ifndef FUSEJIT_CODEGEN_FORMAT_NUMBER_H_
#define FUSEJIT_CODEGEN_FORMAT_NUMBER_H_

#include <string>

#include "fusejit/chain.h"

namespace fusejit {

// Shortest text that parses back to exactly `v` ("0.01", "1e-5", "-3"). Never locale-dependent.
std::string FormatDouble(double v);

// A CUDA float literal equal to float(v), exactly ("1e-05f" style is avoided: "1e-5f",
// "0.0099999998f"); round-trips through strtof. Infinities/NaN are refused by validation earlier.
std::string FloatLiteral(double v);

// The literal of an op argument in a chain of `dtype`: FloatLiteral(v) except for f64 chains,
// whose arithmetic is double: a double literal equal to v ("0.01", "3.0").
std::string RealLiteral(double v, DType dtype);

}  // namespace fusejit

#endif  // FUSEJIT_CODEGEN_FORMAT_NUMBER_H_
