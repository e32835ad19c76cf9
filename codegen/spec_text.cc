#include "codegen/spec_text.h"

#include <cstdint>
#include <utility>

#include "fmt/format.h"

namespace fusejit {
namespace {

// Decodes the UTF-8 character at text[pos]. Returns its length in bytes (0: not valid UTF-8).
size_t DecodeUtf8(std::string_view text, size_t pos, uint32_t* code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  size_t len = 0;
  uint32_t cp = 0, min = 0;
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  } else if ((b0 & 0xe0) == 0xc0) {
    len = 2, cp = b0 & 0x1f, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3, cp = b0 & 0x0f, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (pos + len > text.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(pos + i) & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  *code_point = cp;
  return len;
}

// The ASCII character a code point is easily mistaken for; 0 when none.
char LooksLike(uint32_t cp) {
  static constexpr std::pair<uint32_t, char> kLookAlikes[] = {
      {0x00a0, ' '}, {0x2000, ' '}, {0x2001, ' '}, {0x2002, ' '}, {0x2003, ' '}, {0x2007, ' '},
      {0x2009, ' '}, {0x200a, ' '}, {0x202f, ' '}, {0x3000, ' '}, {0x2010, '-'}, {0x2011, '-'},
      {0x2012, '-'}, {0x2013, '-'}, {0x2014, '-'}, {0x2212, '-'}, {0xfe63, '-'}, {0x2018, '\''},
      {0x2019, '\''}, {0x201c, '"'}, {0x201d, '"'}, {0x00d7, 'x'}, {0x2223, '|'}, {0x01c0, '|'},
      {0x2758, '|'}, {0x00b7, '.'}, {0x2024, '.'}, {0x201a, ','}, {0x3001, ','}, {0x2039, '<'},
      {0x203a, '>'}, {0x2215, '/'}, {0x2217, '*'},
  };
  for (const auto& [code, ascii] : kLookAlikes) {
    if (code == cp) return ascii;
  }
  if (cp >= 0xff01 && cp <= 0xff5e) return static_cast<char>(cp - 0xff01 + 0x21);  // fullwidth
  return 0;
}

}  // namespace

bool IsUnusualCharAt(std::string_view text, size_t pos) {
  if (pos >= text.size()) return false;
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  return c >= 0x7f || (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r');
}

std::string DescribeCharAt(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "the end of the spec";
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  if (c >= 0x20 && c < 0x7f) return fmt::format("'{}'", static_cast<char>(c));
  if (c < 0x80) return fmt::format("control character 0x{:02x}", c);
  uint32_t cp = 0;
  const size_t len = DecodeUtf8(text, pos, &cp);
  if (len == 0) return fmt::format("byte 0x{:02x} (not UTF-8)", c);
  std::string bytes;
  for (size_t i = 0; i < len; ++i) {
    bytes += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(text[pos + i]));
  }
  const char ascii = LooksLike(cp);
  if (ascii != 0) {
    return fmt::format("U+{:04X} (UTF-8 {}, looks like '{}' but is not ASCII)", cp, bytes,
                       ascii);
  }
  return fmt::format("U+{:04X} (UTF-8 {}, not ASCII)", cp, bytes);
}

std::string QuoteExcerpt(std::string_view text, size_t pos) {
  size_t begin = 0, end = text.size();
  if (text.size() > kMaxQuotedBytes) {
    pos = std::min(pos, text.size());
    begin = pos > kMaxQuotedBytes / 2 ? pos - kMaxQuotedBytes / 2 : 0;
    end = std::min(text.size(), begin + kMaxQuotedBytes);
    if (end - begin < kMaxQuotedBytes) begin = end - kMaxQuotedBytes;
    // Never cut a UTF-8 sequence: move past continuation bytes, at most 3 (a sequence's longest
    // tail; a longer run of stray continuation bytes is not UTF-8 and is escaped byte by byte).
    for (int k = 0; k < 3 && begin > 0 &&
                    (static_cast<unsigned char>(text[begin]) & 0xc0) == 0x80;
         ++k) {
      --begin;
    }
    for (int k = 0; k < 3 && end < text.size() &&
                    (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80;
         ++k) {
      ++end;
    }
  }
  std::string out = begin > 0 ? "..." : "";
  for (size_t i = begin; i < end;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    uint32_t cp = 0;
    const size_t len = c >= 0x80 ? DecodeUtf8(text, i, &cp) : 1;
    if (c >= 0x80 && len > 0) {
      out.append(text.substr(i, len));
      i += len;
    } else if (c < 0x20 || c == 0x7f || c >= 0x80 || c == '\\' || c == '"') {
      out += c == '\\' || c == '"' ? fmt::format("\\{}", static_cast<char>(c))
                                   : fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out += static_cast<char>(c);
      ++i;
    }
  }
  if (end < text.size()) out += "...";
  return out;
}

}  // namespace fusejit
