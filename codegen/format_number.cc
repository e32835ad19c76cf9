#include "codegen/format_number.h"

#include <charconv>

namespace fusejit {
namespace {

// to_chars writes exponents as "e-05" / "e+20"; specs and sources read better as "e-5" / "e20".
std::string TidyExponent(std::string s) {
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mantissa = s.substr(0, e), exp = s.substr(e + 1);
  std::string sign;
  if (!exp.empty() && (exp[0] == '+' || exp[0] == '-')) {
    if (exp[0] == '-') sign = "-";
    exp.erase(0, 1);
  }
  while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
  return mantissa + "e" + sign + exp;
}

}  // namespace

std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip, "C" locale
  return TidyExponent(std::string(buf, end));
}

std::string RealLiteral(double v, DType dtype) {
  if (dtype != DType::kF64) return FloatLiteral(v);
  std::string s = FormatDouble(v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string FloatLiteral(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v));
  std::string s = TidyExponent(std::string(buf, end));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

}  // namespace fusejit
