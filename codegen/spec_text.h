// codegen/spec_text.h (internal): how error messages quote user text (specs, manifest lines):
// a bounded excerpt instead of the whole text, and characters outside ASCII named by code point
// and UTF-8 bytes (with the ASCII character they look like, when there is one), so that an
// en dash or a non-breaking space never shows up as an empty quote.
#ifndef FUSEJIT_CODEGEN_SPEC_TEXT_H_
#define FUSEJIT_CODEGEN_SPEC_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace fusejit {

// At most this many bytes of a text are quoted in an error message.
inline constexpr size_t kMaxQuotedBytes = 100;

// `text` for an error message: whole when short, else about kMaxQuotedBytes around byte `pos`
// with "..." where it was cut (never inside a UTF-8 sequence); control characters and bytes that
// are not UTF-8 are written as \xNN, '"' and '\' with a backslash.
std::string QuoteExcerpt(std::string_view text, size_t pos);

// What is at byte `pos` of `text`, for "found ..." in an error: "'c'" for printable ASCII,
// "the end of the spec" past the end, "U+2013 (UTF-8 e2 80 93, looks like '-')" for a UTF-8
// character, "byte 0xff (not UTF-8)" for an invalid byte, "control character 0x07" otherwise.
std::string DescribeCharAt(std::string_view text, size_t pos);

// True when byte `pos` of text starts a character outside printable ASCII (a look-alike, a
// control character or a stray byte): errors there say what it is.
bool IsUnusualCharAt(std::string_view text, size_t pos);

}  // namespace fusejit

#endif  // FUSEJIT_CODEGEN_SPEC_TEXT_H_
