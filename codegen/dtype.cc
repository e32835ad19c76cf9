// Host conversions between float and the chain dtypes (fusejit/chain.h), bit-identical to the
// device's (templates/dtype.cuh).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fusejit/chain.h"

namespace fusejit {
namespace {

uint32_t Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
float FromBits(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

uint16_t ToBf16(float v) {
  uint32_t u = Bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

// IEEE binary16, round to nearest even (as cvt.rn.f16.f32).
uint16_t ToF16(float v) {
  const uint32_t u = Bits(v);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    // value = a * 2^24 half-ulps; round to nearest even integer multiple of 2^-24.
    const float scaled = std::fabs(v) * 16777216.0f;  // exact: a power-of-two scale
    const float r = std::nearbyint(scaled);           // default rounding mode: to nearest even
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((a - 0x38000000u) >> 13);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}
float FromF16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return FromBits(Bits(v) | sign);
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace

float RoundToDType(float v, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return FromBf16(ToBf16(v));
    case DType::kF16: return FromF16(ToF16(v));
    case DType::kF32:
    case DType::kF64: return v;
  }
  return v;
}

void EncodeDType(const float* in, size_t count, DType dtype, void* out) {
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kBF16: {
        const uint16_t h = ToBf16(in[i]);
        std::memcpy(static_cast<char*>(out) + 2 * i, &h, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t h = ToF16(in[i]);
        std::memcpy(static_cast<char*>(out) + 2 * i, &h, 2);
        break;
      }
      case DType::kF32: std::memcpy(static_cast<char*>(out) + 4 * i, &in[i], 4); break;
      case DType::kF64: {
        const double d = in[i];
        std::memcpy(static_cast<char*>(out) + 8 * i, &d, 8);
        break;
      }
    }
  }
}

void DecodeDType(const void* in, size_t count, DType dtype, float* out) {
  const char* p = static_cast<const char*>(in);
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kBF16:
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = dtype == DType::kBF16 ? FromBf16(h) : FromF16(h);
        break;
      }
      case DType::kF32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case DType::kF64: {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
        break;
      }
    }
  }
}

}  // namespace fusejit
