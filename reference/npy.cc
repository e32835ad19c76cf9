// reference/npy.cc: .npy read (format 1.0, 2.0, 3.0) and write (1.0) of float32 C-order tensors.
//
// The format (numpy/lib/format.py): the magic "\x93NUMPY", a major and a minor version byte, the
// header length (uint16 little-endian in 1.0, uint32 in 2.0/3.0), the header -- a Python dict
// literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces
// and ended by '\n' -- then the raw data.
#include "reference/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
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
// The largest .npy file read: a tensor of ChainLimits::kMaxElements float32 values and a header.
constexpr uint64_t kMaxFileBytes = uint64_t{4} * 2147483647 + 16 + kMaxHeaderBytes;

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
  // In 64 bits: a descr such as '<f666666664' must not overflow int (found by fuzz_npy).
  std::string name =
      kind->sized ? fmt::format("{}{}", kind->name, int64_t{8} * bytes) : kind->name;
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

// Where the data of a .npy file starts and what it holds, from the file's first bytes (`prefix`:
// at least the whole header when the file has one) and its size. Every error is a complete
// message naming `path`.
struct NpyLayout {
  NpyHeader header;
  uint64_t data_offset = 0;
};

absl::StatusOr<NpyLayout> ParseLayout(std::string_view prefix, uint64_t file_size,
                                      const std::string& path) {
  const size_t preamble = kMagic.size() + 2;
  const std::string_view magic = prefix.substr(0, kMagic.size());
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not a .npy file: it starts with \"{}\", not the magic \"\\x93NUMPY\"",
                    path, Escaped(magic)));
  }
  if (prefix.size() < preamble) {
    return absl::InvalidArgumentError(
        fmt::format("{}: truncated: the file ends inside the version", path));
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  const int minor = static_cast<unsigned char>(prefix[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: .npy format version {}.{} is not supported; fusejit reads 1.0, 2.0 and 3.0", path,
        major, minor));
  }
  // Header length: uint16 (1.0) or uint32 (2.0, 3.0), little-endian.
  const size_t len_size = major == 1 ? 2 : 4;
  if (prefix.size() < preamble + len_size) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: truncated header length: expected {} bytes, the file has {}", path, len_size,
        prefix.size() - preamble));
  }
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_size; ++i) {
    header_len |= uint64_t{static_cast<unsigned char>(prefix[preamble + i])} << (8 * i);
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: .npy header of {} bytes is longer than the {} bytes fusejit accepts (numpy's own "
        "limit); the file is corrupt or not a float32 tensor",
        path, header_len, kMaxHeaderBytes));
  }
  const uint64_t header_start = preamble + len_size;
  if (prefix.size() < header_start + header_len) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: truncated header: expected {} bytes, the file has {}", path, header_len,
        prefix.size() - header_start));
  }
  absl::StatusOr<NpyHeader> header =
      CheckHeader(path, prefix.substr(header_start, header_len));
  if (!header.ok()) return header.status();
  // The data must be exactly elements * 4 bytes: no fewer (truncated), no more (wrong shape).
  const uint64_t data_start = header_start + header_len;
  const uint64_t have = file_size - data_start;
  const uint64_t need = static_cast<uint64_t>(header->elements) * sizeof(float);
  if (have != need) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {}shape {} of float32 needs {} data bytes, but the file has {} after its {}-byte "
        "header",
        path, have < need ? "truncated data: " : "trailing bytes: ", FormatShape(header->shape),
        need, have, data_start));
  }
  return NpyLayout{*std::move(header), data_start};
}

}  // namespace

absl::StatusOr<HostTensor> ParseNpy(std::string_view bytes, const std::string& name) {
  absl::StatusOr<NpyLayout> layout = ParseLayout(bytes, bytes.size(), name);
  if (!layout.ok()) return layout.status();
  HostTensor t;
  t.shape = layout->header.shape;
  t.data.resize(static_cast<size_t>(layout->header.elements));
  if (!t.data.empty()) {
    std::memcpy(t.data.data(), bytes.data() + layout->data_offset, t.data.size() * sizeof(float));
  }
  return t;
}

absl::StatusOr<HostTensor> ReadNpy(const std::string& path) {
  // O_NONBLOCK: a FIFO cannot block the open; it is refused below, as is anything but a regular
  // file, before a byte is read.
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, fmt::format("{}: cannot open for reading: {}", path,
                                                std::strerror(err)));
  }
  File f(::fdopen(fd, "rb"));
  if (!f) {
    ::close(fd);
    return absl::InternalError(fmt::format("{}: fdopen: {}", path, ErrnoText()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(fmt::format("{}: cannot examine: {}", path, ErrnoText()));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: not a regular file ({}); a .npy tensor must be a regular file", path,
        S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size > kMaxFileBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} bytes is more than the {} bytes fusejit reads from a .npy file", path, file_size,
        kMaxFileBytes));
  }
  // The header: at most magic, version, a 4-byte length and kMaxHeaderBytes.
  std::string prefix(std::min<uint64_t>(file_size, kMagic.size() + 2 + 4 + kMaxHeaderBytes), '\0');
  if (absl::Status s = ReadExactly(f.get(), prefix.data(), prefix.size(), path, "header");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<NpyLayout> layout = ParseLayout(prefix, file_size, path);
  if (!layout.ok()) return layout.status();
  if (std::fseek(f.get(), static_cast<long>(layout->data_offset), SEEK_SET) != 0) {
    return absl::InternalError(fmt::format("{}: cannot seek: {}", path, ErrnoText()));
  }
  HostTensor t;
  t.shape = layout->header.shape;
  t.data.resize(static_cast<size_t>(layout->header.elements));
  if (!t.data.empty()) {
    absl::Status s =
        ReadExactly(f.get(), t.data.data(), t.data.size() * sizeof(float), path, "data");
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
