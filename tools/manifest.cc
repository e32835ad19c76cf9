#include "tools/manifest.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "codegen/spec_text.h"
#include "reference/file_read.h"

namespace fusejit::tools {
namespace {

// At most this many errors are listed per line (a grid line may hold thousands of bad specs);
// the rest are counted in one closing line.
constexpr size_t kMaxErrorsPerLine = 5;

bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// A piece of text at a position of the line; `column` is the 1-based column of text[0].
struct Piece {
  absl::string_view text;
  int column = 1;
};

// A line is literal pieces and grids, in order.
struct Segment {
  bool grid = false;
  Piece literal;             // !grid
  std::vector<Piece> alternatives;  // grid: trimmed, non-empty
  int open_column = 0;       // grid: column of '{'
};

struct LineError {
  int column = 0;
  std::string message;
};

Piece Trim(absl::string_view text, int column) {
  size_t begin = 0, end = text.size();
  while (begin < end && IsSpace(text[begin])) ++begin;
  while (end > begin && IsSpace(text[end - 1])) --end;
  return {text.substr(begin, end - begin), column + static_cast<int>(begin)};
}

// Splits a line (comment already removed) into literal text and grids.
std::optional<LineError> SplitLine(absl::string_view line, std::vector<Segment>* segments) {
  size_t literal_start = 0;
  auto flush_literal = [&](size_t end) {
    if (end > literal_start) {
      Segment s;
      s.literal = {line.substr(literal_start, end - literal_start),
                   static_cast<int>(literal_start) + 1};
      segments->push_back(s);
    }
  };
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '}') {
      return LineError{static_cast<int>(i) + 1, "'}' without a matching '{'"};
    }
    if (line[i] != '{') continue;
    flush_literal(i);
    Segment grid;
    grid.grid = true;
    grid.open_column = static_cast<int>(i) + 1;
    size_t alt_start = i + 1;
    int depth = 0;  // of [] and (), so that `{3,[1,3,3]}` has two alternatives
    size_t j = i + 1;
    bool closed = false;
    for (; j < line.size() && !closed; ++j) {
      const char c = line[j];
      if (c == '{') {
        return LineError{static_cast<int>(j) + 1,
                         absl::StrCat("'{' inside the grid opened at column ", grid.open_column,
                                      "; grids do not nest")};
      }
      if (c == '[' || c == '(') ++depth;
      if ((c == ']' || c == ')') && depth > 0) --depth;
      if ((c == ',' && depth == 0) || c == '}') {
        Piece alt = Trim(line.substr(alt_start, j - alt_start), static_cast<int>(alt_start) + 1);
        if (alt.text.empty()) {
          if (c == '}' && grid.alternatives.empty()) {
            return LineError{grid.open_column,
                             "empty grid '{}'; list its values separated by commas, e.g. {1,8,32}"};
          }
          return LineError{static_cast<int>(j) + 1,
                           absl::StrCat("empty value in the grid opened at column ",
                                        grid.open_column, " (a comma with nothing before it)")};
        }
        grid.alternatives.push_back(alt);
        alt_start = j + 1;
        closed = c == '}';
      }
    }
    if (!closed) {
      return LineError{grid.open_column,
                       "grid '{' is not closed; expected '}' before the end of the line"};
    }
    segments->push_back(std::move(grid));
    literal_start = j;
    i = j - 1;
  }
  flush_literal(line.size());
  return std::nullopt;
}

// One expanded spec and, for each byte of it, the column of the line it came from.
struct Expanded {
  std::string text;
  std::vector<int> columns;
  int end_column = 1;  // the column just after the last byte
};

void Append(const Piece& piece, Expanded* e) {
  e->text.append(piece.text.data(), piece.text.size());
  for (size_t k = 0; k < piece.text.size(); ++k) {
    e->columns.push_back(piece.column + static_cast<int>(k));
  }
  e->end_column = piece.column + static_cast<int>(piece.text.size());
}

Expanded Build(const std::vector<Segment>& segments, const std::vector<size_t>& choice) {
  Expanded e;
  size_t g = 0;
  for (const Segment& s : segments) {
    Append(s.grid ? s.alternatives[choice[g++]] : s.literal, &e);
  }
  return e;
}

// The column of byte `pos` of the expanded spec (pos == size: its end).
int ColumnAt(const Expanded& e, size_t pos) {
  return pos < e.columns.size() ? e.columns[pos] : e.end_column;
}

// Where op `index` (0-based, as ValidateChain's "op K ..." messages count) starts: after the
// (index+1)-th '|' ('|' only separates ops in the grammar). nullopt if there is no such op.
std::optional<size_t> OpPosition(const std::string& spec, size_t index) {
  size_t bars = 0;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] != '|' || ++bars != index + 1) continue;
    size_t p = i + 1;
    while (p < spec.size() && IsSpace(spec[p])) ++p;
    return p;
  }
  return std::nullopt;
}

std::optional<size_t> LeadingNumber(absl::string_view text, size_t* digits_end) {
  size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  *digits_end = static_cast<size_t>(end - text.data());
  return value;
}

// ParseChain's error for an expanded spec, located in the original line.
LineError LocateChainError(const Expanded& e, absl::string_view message, bool grid_line) {
  absl::string_view text = message;
  const std::string trimmed = std::string(Trim(e.text, 1).text);
  size_t pos = 0;  // default: where the spec starts
  while (pos < e.text.size() && IsSpace(e.text[pos])) ++pos;
  size_t n = 0;
  if (absl::ConsumePrefix(&text, "spec column ")) {
    if (std::optional<size_t> col = LeadingNumber(text, &n); col && *col >= 1) {
      pos = *col - 1;
      text.remove_prefix(n);
      absl::ConsumePrefix(&text, ": ");
      // ParseChain ends with ` (in "<excerpt>")` (an excerpt has no unescaped '"'): the line is
      // quoted by the location instead.
      if (const size_t in = text.rfind(" (in \""); in != absl::string_view::npos &&
                                                   absl::EndsWith(text, "\")")) {
        text = text.substr(0, in);
      }
    } else {
      text = message;
    }
  } else if (absl::StartsWith(text, "op ")) {
    if (std::optional<size_t> op = LeadingNumber(text.substr(3), &n)) {
      if (std::optional<size_t> p = OpPosition(e.text, *op)) pos = *p;
    }
  }
  std::string out(text);
  if (grid_line) absl::StrAppend(&out, " (in \"", QuoteExcerpt(trimmed, pos), "\")");
  return {ColumnAt(e, pos), out};
}

std::string Locate(absl::string_view file, size_t line, int column, absl::string_view message) {
  return absl::StrCat(file, ":", line, ":", column, ": ", message);
}

}  // namespace

absl::StatusOr<Manifest> ParseManifest(std::string_view manifest_text,
                                       std::string_view manifest_name,
                                       const ManifestOptions& options) {
  absl::string_view text(manifest_text.data(), manifest_text.size());
  const absl::string_view file_name(manifest_name.data(), manifest_name.size());
  Manifest manifest;
  absl::flat_hash_map<std::string, size_t> seen;  // canonical spec -> entry index
  size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t eol = text.find('\n');
    absl::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == absl::string_view::npos ? text.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > options.max_line_bytes) {
      return absl::InvalidArgumentError(Locate(
          file_name, line_number, static_cast<int>(options.max_line_bytes) + 1,
          absl::StrCat("the line is ", line.size(), " bytes long; the limit is ",
                       options.max_line_bytes, " bytes per line")));
    }
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    if (Trim(line, 1).text.empty()) continue;

    std::vector<Segment> segments;
    if (std::optional<LineError> error = SplitLine(line, &segments)) {
      manifest.errors.push_back(Locate(file_name, line_number, error->column, error->message));
      ++manifest.specs;
      ++manifest.invalid_specs;
      continue;
    }
    std::vector<size_t> sizes;
    int first_grid = 0;
    size_t count = 1;
    bool overflow = false;
    for (const Segment& s : segments) {
      if (!s.grid) continue;
      if (first_grid == 0) first_grid = s.open_column;
      sizes.push_back(s.alternatives.size());
      overflow = overflow || __builtin_mul_overflow(count, s.alternatives.size(), &count);
    }
    if (overflow || count > options.max_specs || manifest.specs + count > options.max_specs) {
      std::vector<std::string> factors;
      for (size_t s : sizes) factors.push_back(absl::StrCat(s));
      const std::string expands =
          overflow ? "more than 2^64 specs" : absl::StrCat(count, " specs");
      return absl::InvalidArgumentError(Locate(
          file_name, line_number, first_grid == 0 ? 1 : first_grid,
          absl::StrCat("this line expands to ", expands,
                       sizes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(factors, " x "), ")"),
                       "; with the ", manifest.specs,
                       " specs before it the manifest would exceed its limit of ",
                       options.max_specs, " specs; split it or shrink the grids")));
    }
    manifest.specs += count;

    const bool grid_line = !sizes.empty();
    size_t line_errors = 0;
    std::vector<size_t> choice(sizes.size(), 0);
    for (size_t k = 0; k < count; ++k) {
      Expanded e = Build(segments, choice);
      absl::StatusOr<Chain> chain = ParseChain(e.text);
      if (!chain.ok()) {
        ++manifest.invalid_specs;
        if (++line_errors <= kMaxErrorsPerLine) {
          LineError error = LocateChainError(e, chain.status().message(), grid_line);
          manifest.errors.push_back(Locate(file_name, line_number, error.column, error.message));
        }
      } else {
        std::string spec = FormatChain(*chain);
        auto [it, inserted] = seen.emplace(spec, manifest.entries.size());
        if (inserted) {
          manifest.entries.push_back(
              {*std::move(chain), std::move(spec), absl::StrCat(file_name, ":", line_number)});
        } else {
          ++manifest.duplicates;
        }
      }
      // Next choice: the last grid varies fastest.
      for (size_t g = sizes.size(); g-- > 0;) {
        if (++choice[g] < sizes[g]) break;
        choice[g] = 0;
      }
    }
    if (line_errors > kMaxErrorsPerLine) {
      manifest.errors.push_back(absl::StrCat(file_name, ":", line_number, ": ",
                                             line_errors - kMaxErrorsPerLine,
                                             " more specs of this line have errors"));
    }
  }
  return manifest;
}

absl::StatusOr<Manifest> ReadManifest(const std::string& path, const ManifestOptions& options) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, options.max_bytes, "manifest");
  if (!text.ok()) return text.status();
  return ParseManifest(*text, path, options);
}

}  // namespace fusejit::tools
