// reference/npy.cc: .npy read (format 1.0, 2.0, 3.0) and write (1.0) of float32 C-order tensors.
//
// The format (numpy/lib/format.py): the magic "\x93NUMPY", a major and a minor version byte, the
// header length (uint16 little-endian in 1.0, uint32 in 2.0/3.0), the header -- a Python dict
// literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces
// and ended by '\n' -- then the raw data.
#include "reference/npy.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>

#include "fmt/format.h"

namespace fusejit {
namespace {

static_assert(std::endian::native == std::endian::little,
              "npy.cc copies '<f4' data as is and needs a little-endian host");

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kMaxHeaderBytes = 10000;  // numpy's own default limit (max_header_size)
constexpr int64_t kMaxElements = int64_t{1} << 40;

std::string ErrnoText() { return std::strerror(errno); }

// Bytes as a readable literal: printable ASCII as is, the rest as \xNN.
std::string Escaped(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s += static_cast<char>(c);
    } else {
      s += fmt::format("\\x{:02x}", c);
    }
  }
  return s;
}

// ---- The header: a small parser for the Python literals numpy writes. ----

// A parsed literal. `text` is its source span (for messages).
struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList } kind = Kind::kNone;
  std::string_view text;
  std::string str;             // kString
  int64_t integer = 0;         // kInt
  bool boolean = false;        // kBool
  std::vector<PyValue> items;  // kTuple, kList
};

class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  // Parses `{key: value, ...}` followed only by whitespace. Errors say where parsing stopped.
  absl::StatusOr<std::map<std::string, PyValue>> ParseDict() {
    std::map<std::string, PyValue> dict;
    SkipSpace();
    if (!Eat('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Eat('}')) break;
      absl::StatusOr<PyValue> key = ParseValue();
      if (!key.ok()) return key.status();
      if (key->kind != PyValue::Kind::kString) return Error("expected a string key");
      SkipSpace();
      if (!Eat(':')) return Error("expected ':'");
      absl::StatusOr<PyValue> value = ParseValue();
      if (!value.ok()) return value.status();
      if (!dict.emplace(key->str, *std::move(value)).second) {
        return Error(fmt::format("duplicate key '{}'", key->str));
      }
      SkipSpace();
      if (Eat('}')) break;
      if (!Eat(',')) return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the closing '}'");
    return dict;
  }

 private:
  absl::StatusOr<PyValue> ParseValue() {
    SkipSpace();
    const size_t start = pos_;
    absl::StatusOr<PyValue> v = ParseValueAt();
    if (v.ok()) v->text = text_.substr(start, pos_ - start);
    return v;
  }

  absl::StatusOr<PyValue> ParseValueAt() {
    if (pos_ >= text_.size()) return Error("unexpected end of header");
    const char c = text_[pos_];
    if (c == '\'' || c == '"') return ParseString();
    if (c == '(' || c == '[') return ParseSequence();
    if (c == '-' || (c >= '0' && c <= '9')) return ParseInt();
    for (auto [word, kind, boolean] : {std::tuple{"True", PyValue::Kind::kBool, true},
                                       std::tuple{"False", PyValue::Kind::kBool, false},
                                       std::tuple{"None", PyValue::Kind::kNone, false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::string_view(word).size();
        PyValue v;
        v.kind = kind;
        v.boolean = boolean;
        return v;
      }
    }
    return Error("expected a string, number, True, False, None, tuple or list");
  }

  absl::StatusOr<PyValue> ParseString() {
    const char quote = text_[pos_++];
    PyValue v;
    v.kind = PyValue::Kind::kString;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      v.str += text_[pos_++];
    }
    if (!Eat(quote)) return Error("unterminated string");
    return v;
  }

  absl::StatusOr<PyValue> ParseInt() {
    const size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    PyValue v;
    v.kind = PyValue::Kind::kInt;
    auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, v.integer);
    if (ec != std::errc() || end != text_.data() + pos_) {
      pos_ = start;
      return Error("malformed or too large integer");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;  // Python 2
    return v;
  }

  // (a, b, ...) or [a, b, ...]; a trailing comma is allowed, as in Python.
  absl::StatusOr<PyValue> ParseSequence() {
    const char close = text_[pos_++] == '(' ? ')' : ']';
    PyValue v;
    v.kind = close == ')' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
    while (true) {
      SkipSpace();
      if (Eat(close)) return v;
      absl::StatusOr<PyValue> item = ParseValue();
      if (!item.ok()) return item.status();
      v.items.push_back(*std::move(item));
      SkipSpace();
      if (Eat(close)) return v;
      if (!Eat(',')) return Error(fmt::format("expected ',' or '{}'", close));
    }
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(fmt::format("{} at offset {}", what, pos_));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// A readable name for a numpy dtype string: '<f8' -> "float64", '>f4' -> "float32 big-endian".
std::string DescribeDtype(std::string_view descr) {
  if (descr.size() < 3 || std::string_view("<>|=").find(descr[0]) == std::string_view::npos) {
    return "unknown dtype";
  }
  int bytes = 0;
  auto [end, ec] = std::from_chars(descr.data() + 2, descr.data() + descr.size(), bytes);
  if (ec != std::errc() || end != descr.data() + descr.size()) return "unknown dtype";
  struct Kind {
    char code;
    const char* name;
    bool sized;  // the name takes the size in bits: float64, int32
  };
  static constexpr Kind kKinds[] = {
      {'f', "float", true},        {'i', "int", true},
      {'u', "uint", true},         {'c', "complex", true},
      {'b', "bool", false},        {'U', "unicode string", false},
      {'S', "byte string", false}, {'O', "Python object", false},
      {'M', "datetime64", false},  {'m', "timedelta64", false},
      {'V', "raw bytes", false},
  };
  const Kind* kind = std::find_if(std::begin(kKinds), std::end(kKinds),
                                  [&](const Kind& k) { return k.code == descr[1]; });
  if (kind == std::end(kKinds)) return "unknown dtype";
  std::string name = kind->sized ? fmt::format("{}{}", kind->name, 8 * bytes) : kind->name;
  if (descr[0] == '>' && bytes > 1) name += " big-endian";
  if (descr[0] == '=' && bytes > 1) name += " in native byte order";
  return name;
}

struct NpyHeader {
  Shape shape;
  int64_t elements = 0;
};

// Checks the header dict of file `path`; errors are complete messages.
absl::StatusOr<NpyHeader> CheckHeader(const std::string& path, std::string_view text) {
  absl::StatusOr<std::map<std::string, PyValue>> dict = HeaderParser(text).ParseDict();
  if (!dict.ok()) {
    return absl::InvalidArgumentError(fmt::format("{}: malformed .npy header \"{}\": {}", path,
                                                  Escaped(text.substr(0, 300)),
                                                  std::string(dict.status().message())));
  }
  for (const auto& [key, value] : *dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      return absl::InvalidArgumentError(
          fmt::format("{}: unexpected key '{}' in the .npy header; expected exactly 'descr', "
                      "'fortran_order' and 'shape'",
                      path, Escaped(key)));
    }
  }
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict->contains(key)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: the .npy header has no '{}' key", path, key));
    }
  }

  const PyValue& descr = dict->at("descr");
  if (descr.kind != PyValue::Kind::kString) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: dtype {} (structured) is not supported; fusejit reads float32 little-endian ('<f4')",
        path, Escaped(descr.text)));
  }
  if (descr.str != "<f4") {
    return absl::InvalidArgumentError(fmt::format(
        "{}: dtype '{}' ({}) is not supported; fusejit reads float32 little-endian ('<f4')", path,
        Escaped(descr.str), DescribeDtype(descr.str)));
  }

  const PyValue& fortran = dict->at("fortran_order");
  if (fortran.kind != PyValue::Kind::kBool) {
    return absl::InvalidArgumentError(fmt::format("{}: fortran_order is {}; expected True or False",
                                                  path, Escaped(fortran.text)));
  }
  if (fortran.boolean) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: fortran_order is True (column-major data); fusejit reads C-order arrays only "
        "(save np.ascontiguousarray(a))",
        path));
  }

  const PyValue& shape = dict->at("shape");
  if (shape.kind != PyValue::Kind::kTuple) {
    return absl::InvalidArgumentError(
        fmt::format("{}: shape {} is not a tuple of integers", path, Escaped(shape.text)));
  }
  NpyHeader header;
  header.elements = 1;
  for (const PyValue& d : shape.items) {
    if (d.kind != PyValue::Kind::kInt || d.integer < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: shape {} is not a tuple of non-negative integers", path, Escaped(shape.text)));
    }
    header.shape.push_back(d.integer);
    if (d.integer != 0 && header.elements > kMaxElements / d.integer) {
      return absl::InvalidArgumentError(fmt::format("{}: shape {} has more than {} elements", path,
                                                    Escaped(shape.text), kMaxElements));
    }
    header.elements *= d.integer;
  }
  return header;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Reads exactly n bytes or reports how many there were.
absl::Status ReadExactly(std::FILE* f, void* dst, size_t n, const std::string& path,
                         std::string_view what) {
  const size_t got = std::fread(dst, 1, n, f);
  if (got == n) return absl::OkStatus();
  if (std::ferror(f)) {
    return absl::DataLossError(fmt::format("{}: read error in {}: {}", path, what, ErrnoText()));
  }
  return absl::DataLossError(
      fmt::format("{}: truncated {}: expected {} bytes, the file has {}", path, what, n, got));
}

// A shape as numpy prints it: (), (5,), (2, 3).
std::string ShapeTuple(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// The complete 1.0 header (magic to '\n'), padded so the data starts at a multiple of 64 bytes.
std::string EncodeHeader(const Shape& shape) {
  std::string dict =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}", ShapeTuple(shape));
  const size_t unpadded = kMagic.size() + 2 + 2 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

}  // namespace

absl::StatusOr<HostTensor> ReadNpy(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    return absl::NotFoundError(fmt::format("{}: cannot open for reading: {}", path, ErrnoText()));
  }
  std::string preamble(kMagic.size() + 2, '\0');
  const size_t got = std::fread(preamble.data(), 1, preamble.size(), f.get());
  if (got < kMagic.size() || std::string_view(preamble).substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not a .npy file: it starts with \"{}\", not the magic \"\\x93NUMPY\"",
                    path, Escaped(std::string_view(preamble).substr(0, got))));
  }
  if (got < preamble.size()) {
    return absl::DataLossError(
        fmt::format("{}: truncated: the file ends inside the version", path));
  }
  const int major = static_cast<unsigned char>(preamble[6]);
  const int minor = static_cast<unsigned char>(preamble[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: .npy format version {}.{} is not supported; fusejit reads 1.0, 2.0 and 3.0", path,
        major, minor));
  }

  // Header length: uint16 (1.0) or uint32 (2.0, 3.0), little-endian.
  unsigned char len_bytes[4] = {0, 0, 0, 0};
  const size_t len_size = major == 1 ? 2 : 4;
  if (absl::Status s = ReadExactly(f.get(), len_bytes, len_size, path, "header length"); !s.ok()) {
    return s;
  }
  const uint64_t header_len = len_bytes[0] | (len_bytes[1] << 8) | (uint64_t{len_bytes[2]} << 16) |
                              (uint64_t{len_bytes[3]} << 24);
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: .npy header of {} bytes is longer than the {} bytes fusejit accepts (numpy's own "
        "limit); the file is corrupt or not a float32 tensor",
        path, header_len, kMaxHeaderBytes));
  }
  std::string header_text(header_len, '\0');
  if (absl::Status s = ReadExactly(f.get(), header_text.data(), header_len, path, "header");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<NpyHeader> header = CheckHeader(path, header_text);
  if (!header.ok()) return header.status();

  // The data must be exactly elements * 4 bytes: no fewer (truncated), no more (wrong shape).
  const long data_start = std::ftell(f.get());
  if (data_start < 0 || std::fseek(f.get(), 0, SEEK_END) != 0) {
    return absl::DataLossError(fmt::format("{}: cannot seek: {}", path, ErrnoText()));
  }
  const long file_end = std::ftell(f.get());
  if (file_end < 0 || std::fseek(f.get(), data_start, SEEK_SET) != 0) {
    return absl::DataLossError(fmt::format("{}: cannot seek: {}", path, ErrnoText()));
  }
  const int64_t have = file_end - data_start;
  const int64_t need = header->elements * static_cast<int64_t>(sizeof(float));
  if (have != need) {
    return absl::DataLossError(fmt::format(
        "{}: {}shape {} of float32 needs {} data bytes, but the file has {} after its {}-byte "
        "header",
        path, have < need ? "truncated data: " : "trailing bytes: ", FormatShape(header->shape),
        need, have, data_start));
  }

  HostTensor t;
  t.shape = header->shape;
  t.data.resize(static_cast<size_t>(header->elements));
  if (need > 0) {
    absl::Status s = ReadExactly(f.get(), t.data.data(), static_cast<size_t>(need), path, "data");
    if (!s.ok()) return s;
  }
  return t;
}

absl::Status WriteNpy(const std::string& path, const HostTensor& tensor) {
  int64_t elements = 1;
  for (int64_t d : tensor.shape) {
    if (d < 0 || (d != 0 && elements > kMaxElements / d)) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: cannot write shape {}: negative or too large", path, FormatShape(tensor.shape)));
    }
    elements *= d;
  }
  if (static_cast<int64_t>(tensor.data.size()) != elements) {
    return absl::InvalidArgumentError(
        fmt::format("{}: cannot write: shape {} has {} elements, but the data holds {} values",
                    path, FormatShape(tensor.shape), elements, tensor.data.size()));
  }
  const std::string header = EncodeHeader(tensor.shape);
  if (header.size() - 10 > 0xffff) {
    return absl::InvalidArgumentError(
        fmt::format("{}: cannot write shape {}: header too long", path, FormatShape(tensor.shape)));
  }

  // A name no other writer (thread or process) uses at the same time.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        fmt::format("{}: cannot create temporary file {}: {}", path, tmp, ErrnoText()));
  }
  const size_t data_bytes = tensor.data.size() * sizeof(float);
  std::string error;
  if (std::fwrite(header.data(), 1, header.size(), f) != header.size() ||
      (data_bytes > 0 && std::fwrite(tensor.data.data(), 1, data_bytes, f) != data_bytes)) {
    error = fmt::format("write to {} failed: {}", tmp, ErrnoText());
  }
  if (std::fclose(f) != 0 && error.empty()) {
    error = fmt::format("close of {} failed: {}", tmp, ErrnoText());
  }
  if (error.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = fmt::format("rename of {} to {} failed: {}", tmp, path, ErrnoText());
  }
  if (!error.empty()) {
    std::remove(tmp.c_str());
    return absl::DataLossError(fmt::format("{}: {}", path, error));
  }
  return absl::OkStatus();
}

}  // namespace fusejit
