// The spec grammar (whitespace is free between tokens):
//   spec   := input ('|' op)*
//   input  := 'x' ':' dtype '[' int (',' int)* ']'      dtype := f32 | f16 | bf16 | f64
//   op     := name ['(' [arg (',' arg)*] ')']
//   arg    := name '=' value
//   value  := number | 'true' | 'false' | '[' number (',' number)* ']'
// Errors give the column (1-based) and say what would be valid there.
// Numbers are kept as text until their use is known: sizes are parsed as integers (never through
// a floating-point cast) with range checks; reals must be finite. ValidateChain then checks every
// value against ChainLimits and the chain's dtype.
#include <charconv>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codegen/spec_text.h"
#include "fusejit/chain.h"
#include "codegen/op_table.h"

namespace fusejit {
namespace {

// A number as written, and where.
struct Token {
  std::string_view text;
  size_t column = 0;
};

struct Value {
  std::vector<Token> numbers;  // one for a scalar; several for a list
  bool is_list = false;
  std::optional<bool> boolean;
  size_t column = 0;
  std::string text;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<Chain> Parse() {
    Chain chain;
    if (text_.size() > ChainLimits::kMaxSpecBytes) {
      return ErrorAt(ChainLimits::kMaxSpecBytes,
                     absl::StrCat("the spec is ", text_.size(), " bytes long; the limit is ",
                                  ChainLimits::kMaxSpecBytes, " bytes"));
    }
    if (absl::Status s = ParseInput(&chain.input, &chain.dtype); !s.ok()) return s;
    while (true) {
      SkipSpace();
      if (pos_ == text_.size()) break;
      if (!Consume('|')) return Error("expected '|' between ops");
      if (chain.ops.size() == ChainLimits::kMaxOps) {
        return Error(absl::StrCat("more than ", ChainLimits::kMaxOps,
                                  " ops; the limit is ", ChainLimits::kMaxOps, " ops per chain"));
      }
      Op op;
      if (absl::Status s = ParseOp(chain.ops.size(), &op); !s.ok()) return s;
      chain.ops.push_back(std::move(op));
    }
    return chain;
  }

 private:
  absl::Status Error(std::string_view what) const { return ErrorAt(pos_, what); }
  // "spec column N: what (in "excerpt")"; a character outside printable ASCII at N is named.
  absl::Status ErrorAt(size_t pos, std::string_view what) const {
    std::string message(what);
    if (IsUnusualCharAt(text_, pos) && message.find("U+") == std::string::npos &&
        message.find("byte 0x") == std::string::npos) {
      absl::StrAppend(&message, "; found ", DescribeCharAt(text_, pos));
    }
    return absl::InvalidArgumentError(absl::StrCat("spec column ", pos + 1, ": ", message,
                                                   " (in \"", QuoteExcerpt(text_, pos), "\")"));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::string Identifier() {
    SkipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  // A number's text: [+-] digits, '.', exponent, or inf/nan words (refused where they are used).
  absl::StatusOr<Token> Number() {
    SkipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.' ||
            text_[pos_] == '-' || text_[pos_] == '+')) {
      ++pos_;
    }
    std::string_view tok = text_.substr(start, pos_ - start);
    if (tok.empty()) {
      return ErrorAt(start, absl::StrCat("expected a number, found ", DescribeCharAt(text_, start)));
    }
    double v = 0;
    std::string_view digits = tok[0] == '+' ? tok.substr(1) : tok;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (end != digits.data() + digits.size() || digits.empty() ||
        (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      return ErrorAt(start, absl::StrCat("expected a number, found '", std::string(tok), "'"));
    }
    return Token{tok, start};
  }

  // The token as an integer in [min, max]; `what` names it in errors ("k", "input size"), after
  // the context `ctx` ("op 0 conv3d: ").
  absl::StatusOr<int64_t> Integer(const Token& t, const std::string& ctx, const std::string& what,
                                  int64_t min, int64_t max) const {
    std::string_view digits = t.text[0] == '+' ? t.text.substr(1) : t.text;
    int64_t v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (digits.empty() || end != digits.data() + digits.size() ||
        (ec != std::errc() && ec != std::errc::result_out_of_range)) {
      return ErrorAt(t.column, absl::StrCat(ctx, what, "=", std::string(t.text),
                                            " must be a whole number"));
    }
    if (ec == std::errc::result_out_of_range) {
      return ErrorAt(t.column, absl::StrCat(ctx, what, "=", std::string(t.text),
                                            " is out of range (beyond 64-bit integers)"));
    }
    if (v < min || v > max) {
      return ErrorAt(t.column, absl::StrCat(ctx, what, "=", std::string(t.text),
                                            " is out of range; ", what, " must be in [", min,
                                            ", ", max, "]"));
    }
    return v;
  }

  // The token as a finite real number.
  absl::StatusOr<double> Real(const Token& t, const std::string& what) const {
    std::string_view digits = t.text[0] == '+' ? t.text.substr(1) : t.text;
    double v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec == std::errc::result_out_of_range) {
      // from_chars reports underflow and overflow alike: tell them apart by the exponent's sign
      // (or, without one, by a leading "0." / ".").
      const size_t e = digits.find_first_of("eE");
      const std::string_view unsigned_digits = digits.substr(digits[0] == '-' ? 1 : 0);
      const bool tiny = e != std::string_view::npos
                            ? e + 1 < digits.size() && digits[e + 1] == '-'
                            : unsigned_digits.rfind("0.", 0) == 0 ||
                                  unsigned_digits.rfind(".", 0) == 0;
      return ErrorAt(t.column, absl::StrCat(what, "=", std::string(t.text),
                                            tiny ? " is too small to be represented (it rounds "
                                                   "to 0 even in f64)"
                                                 : " is too large to be represented (beyond "
                                                   "f64's range)"));
    }
    if (ec != std::errc() || !std::isfinite(v)) {
      return ErrorAt(t.column, absl::StrCat(what, "=", std::string(t.text),
                                            " must be a finite number"));
    }
    return v;
  }

  absl::Status ParseInput(Shape* shape, DType* dtype_out) {
    SkipSpace();
    size_t start = pos_;
    if (Identifier() != "x" || !Consume(':')) {
      return ErrorAt(start, "a spec starts with the input, e.g. 'x:f32[8,3,16,32,32]'");
    }
    size_t dtype_pos = pos_;
    std::string dtype = Identifier();
    if (!ParseDType(dtype, dtype_out)) {
      return ErrorAt(dtype_pos,
                     dtype.empty() ? std::string("expected the input dtype after 'x:'; write f32, "
                                                 "f16, bf16 or f64")
                                   : absl::StrCat("input type '", dtype,
                                                  "' is not a dtype; write f32, f16, bf16 or f64"));
    }
    if (!Consume('[')) {
      return Error(absl::StrCat("expected '[' and the input shape after x:", dtype));
    }
    do {
      if (shape->size() == 5) {
        return Error(absl::StrCat("more than 5 input sizes; fusejit takes 5-D NCDHW input such "
                                  "as x:", dtype, "[8,3,16,32,32]"));
      }
      absl::StatusOr<Token> t = Number();
      if (!t.ok()) return t.status();
      absl::StatusOr<int64_t> v = Integer(*t, "", "input size", std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max());
      if (!v.ok()) return v.status();
      shape->push_back(*v);
    } while (Consume(','));
    if (!Consume(']')) return Error("expected ']' closing the input shape");
    return absl::OkStatus();
  }

  absl::Status ParseValue(Value* v) {
    SkipSpace();
    v->column = pos_;
    size_t start = pos_;
    if (Consume('[')) {
      v->is_list = true;
      do {
        if (v->numbers.size() == 8) return Error("a list has at most 8 values");
        absl::StatusOr<Token> n = Number();
        if (!n.ok()) return n.status();
        v->numbers.push_back(*n);
      } while (Consume(','));
      if (!Consume(']')) return Error("expected ']' closing the list");
    } else if (pos_ < text_.size() && std::isalpha(static_cast<unsigned char>(text_[pos_])) &&
               text_[pos_] != 'e') {
      std::string word = Identifier();
      if (word == "true" || word == "True") {
        v->boolean = true;
      } else if (word == "false" || word == "False") {
        v->boolean = false;
      } else {
        return ErrorAt(start, absl::StrCat("expected a number, a list or true/false, found '",
                                           word, "'"));
      }
    } else {
      if (pos_ < text_.size() && text_[pos_] == '(') {
        return ErrorAt(start,
                       "expected a number or a list; write per-dimension values in "
                       "brackets, e.g. k=[3,1,3]");
      }
      absl::StatusOr<Token> n = Number();
      if (!n.ok()) return n.status();
      v->numbers.push_back(*n);
    }
    v->text = std::string(text_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  // "its arguments are a, b (or b2), c" / "it takes no arguments", for error messages.
  static std::string ArgNamesText(const OpDesc& desc) {
    if (desc.args.empty()) return "it takes no arguments";
    std::vector<std::string> names;
    for (const OpArgDesc& a : desc.args) {
      names.push_back(a.alias ? absl::StrCat(a.name, " (or ", a.alias, ")") : a.name);
    }
    return absl::StrCat("its arguments are ", absl::StrJoin(names, ", "));
  }

  absl::Status ParseOp(size_t index, Op* op) {
    SkipSpace();
    size_t name_pos = pos_;
    std::string name = Identifier();
    const OpDesc* desc = FindOp(name);
    if (desc == nullptr) {
      return ErrorAt(name_pos,
                     absl::StrCat(name.empty() ? "missing op, found " + DescribeCharAt(text_, name_pos)
                                               : "unknown op '" + name + "'",
                                  "; ops are ", OpNamesText()));
    }
    op->kind = desc->kind;
    std::map<std::string, Value> args;
    std::vector<std::string> order;
    if (Consume('(')) {
      if (!Consume(')')) {
        do {
          SkipSpace();
          size_t arg_pos = pos_;
          std::string key = Identifier();
          const bool positional =
              key.empty() ? pos_ < text_.size() &&
                                (text_[pos_] == '-' || text_[pos_] == '.' || text_[pos_] == '+' ||
                                 text_[pos_] == '[' || text_[pos_] == '(')
                          : std::isdigit(static_cast<unsigned char>(key[0])) != 0;
          if (positional) {
            return ErrorAt(arg_pos,
                           absl::StrCat(name, ": arguments are given by name (name=value); ",
                                        ArgNamesText(*desc)));
          }
          if (key.empty()) return Error("expected an argument name, e.g. k=3");
          if (!Consume('=')) {
            return Error(absl::StrCat("expected '=' after argument '", key, "' (", name, ": ",
                                      ArgNamesText(*desc), ")"));
          }
          Value v;
          if (absl::Status s = ParseValue(&v); !s.ok()) return s;
          if (args.count(key)) {
            return ErrorAt(arg_pos, absl::StrCat(name, ": argument '", key, "' given twice"));
          }
          args[key] = std::move(v);
          order.push_back(key);
        } while (Consume(','));
        if (!Consume(')')) return Error("expected ',' or ')' in the argument list");
      }
    }
    return BuildOp(index, name, name_pos, args, op);
  }

  // Interprets `args` for op kind op->kind; every argument must be known and of the right type.
  absl::Status BuildOp(size_t index, const std::string& name, size_t name_pos,
                       std::map<std::string, Value>& args, Op* op) {
    const std::string ctx = absl::StrCat("op ", index, " ", name, ": ");
    auto take = [&](const char* key) -> Value* {
      auto it = args.find(key);
      return it == args.end() ? nullptr : &it->second;
    };
    // Sizes are range-checked by ValidateChain (against ChainLimits, naming the limit); here only
    // that they are integers that fit the field (int64_t).
    auto integer = [&](const Token& t, const char* key, int64_t* out) -> absl::Status {
      absl::StatusOr<int64_t> v = Integer(t, ctx, key, std::numeric_limits<int64_t>::min(),
                                          std::numeric_limits<int64_t>::max());
      if (!v.ok()) return v.status();
      *out = *v;
      return absl::OkStatus();
    };
    auto scalar_int = [&](const char* key, int64_t* out, bool required) -> absl::Status {
      Value* v = take(key);
      if (!v) {
        return required ? ErrorAt(name_pos, absl::StrCat(ctx, "missing required argument '",
                                                         key, "'"))
                        : absl::OkStatus();
      }
      if (v->is_list || v->boolean) {
        return ErrorAt(v->column, absl::StrCat(ctx, key, " takes one whole number"));
      }
      return integer(v->numbers[0], key, out);
    };
    auto triple = [&](const char* key, Dims3* out, bool required) -> absl::Status {
      Value* v = take(key);
      if (!v) {
        return required ? ErrorAt(name_pos, absl::StrCat(ctx, "missing required argument '",
                                                         key, "'"))
                        : absl::OkStatus();
      }
      if (v->boolean || (v->is_list && v->numbers.size() != 3)) {
        return ErrorAt(v->column, absl::StrCat(ctx, key, " takes a whole number or [d,h,w]"));
      }
      for (int a = 0; a < 3; ++a) {
        const Token& t = v->is_list ? v->numbers[a] : v->numbers[0];
        if (absl::Status s = integer(t, key, &(*out)[a]); !s.ok()) return s;
      }
      return absl::OkStatus();
    };
    // Two spellings of one argument may not both be given.
    auto conflict = [&](const char* a, const char* b) -> absl::Status {
      Value* second = take(b);
      if (take(a) == nullptr || second == nullptr) return absl::OkStatus();
      return ErrorAt(second->column, absl::StrCat(ctx, "'", a, "' and '", b, "' are the same argument "
                                                  "(aliases); give only one"));
    };
    auto real = [&](const char* key, double* out, bool required) -> absl::Status {
      Value* v = take(key);
      if (!v) {
        return required ? ErrorAt(name_pos, absl::StrCat(ctx, "missing required argument '",
                                                         key, "'"))
                        : absl::OkStatus();
      }
      if (v->is_list || v->boolean) return ErrorAt(v->column, absl::StrCat(ctx, key, " takes a number"));
      absl::StatusOr<double> x = Real(v->numbers[0], absl::StrCat(ctx, key));
      if (!x.ok()) return x.status();
      *out = *x;
      return absl::OkStatus();
    };

    // The names (and aliases) the op takes, from the op table; an alias and its name may not both
    // be given; an alias given is read as its name (PyTorch's spellings: kernel_size for k,
    // out_channels for out, num_groups for groups, negative_slope for slope, dim for dims).
    // Unknown arguments are refused first: a misspelt one is often why a required one "is
    // missing".
    std::vector<std::string> known;
    absl::Status s;
    for (const OpArgDesc& a : Describe(op->kind).args) {
      known.push_back(a.name);
      if (a.alias != nullptr) known.push_back(a.alias);
    }
    for (const auto& [key, value] : args) {
      if (key == "output_padding" && op->kind == OpKind::kConv3d) {
        return ErrorAt(value.column,
                       absl::StrCat(ctx, "output_padding applies to conv_transpose3d only"));
      }
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return ErrorAt(value.column - key.size() - 1,
                       absl::StrCat(ctx, "unknown argument '", key, "'",
                                    known.empty() ? std::string("; ") + name + " takes none"
                                                  : "; valid: " + absl::StrJoin(known, ", ")));
      }
    }
    for (const OpArgDesc& a : Describe(op->kind).args) {
      if (a.alias == nullptr) continue;
      if (s = conflict(a.name, a.alias); !s.ok()) return s;
      if (auto it = args.find(a.alias); it != args.end()) {
        Value v = std::move(it->second);
        args.erase(it);
        args[a.name] = std::move(v);
      }
    }
    switch (op->kind) {
      case OpKind::kConv3d:
      case OpKind::kConvTranspose3d: {
        const bool transposed = op->kind == OpKind::kConvTranspose3d;
        ConvAttrs& c = op->conv;
        if (s = scalar_int("out", &c.out_channels, true); !s.ok()) return s;
        if (s = triple("k", &c.kernel, true); !s.ok()) return s;
        if (s = triple("stride", &c.stride, false); !s.ok()) return s;
        if (s = triple("padding", &c.padding, false); !s.ok()) return s;
        if (s = triple("dilation", &c.dilation, false); !s.ok()) return s;
        if (transposed) {
          if (s = triple("output_padding", &c.output_padding, false); !s.ok()) return s;
        }
        if (Value* b = take("bias")) {
          if (!b->boolean) return ErrorAt(b->column, absl::StrCat(ctx, "bias takes true or false"));
          c.bias = *b->boolean;
        }
        break;
      }
      case OpKind::kLeakyRelu:
        if (s = real("slope", &op->slope, false); !s.ok()) return s;
        break;
      case OpKind::kClamp: {  // either bound may be left out (PyTorch's min=None / max=None)
        op->min = -std::numeric_limits<double>::infinity();
        op->max = std::numeric_limits<double>::infinity();
        const bool given = args.count("min") > 0 || args.count("max") > 0;
        if (s = real("min", &op->min, false); !s.ok()) return s;
        if (s = real("max", &op->max, false); !s.ok()) return s;
        if (!given) {
          return ErrorAt(name_pos, absl::StrCat(ctx, "clamp needs min, max or both "
                                                     "(clamp(min=0), clamp(max=6), "
                                                     "clamp(min=-1,max=1))"));
        }
        break;
      }
      case OpKind::kMul:
      case OpKind::kAdd:
        if (s = real("by", &op->by, true); !s.ok()) return s;
        break;
      case OpKind::kSoftplus:  // PyTorch's defaults (the Op's)
        if (s = real("beta", &op->beta, false); !s.ok()) return s;
        if (s = real("threshold", &op->threshold, false); !s.ok()) return s;
        break;
      case OpKind::kElu:
      case OpKind::kCelu:
        if (s = real("alpha", &op->alpha, false); !s.ok()) return s;
        break;
      case OpKind::kHardtanh:  // PyTorch's defaults
        op->min = -1;
        op->max = 1;
        if (s = real("min", &op->min, false); !s.ok()) return s;
        if (s = real("max", &op->max, false); !s.ok()) return s;
        break;
      case OpKind::kGroupNorm:
        if (s = scalar_int("groups", &op->groups, true); !s.ok()) return s;
        if (s = real("eps", &op->eps, false); !s.ok()) return s;
        break;
      case OpKind::kMean: {
        Value* v = take("dims");
        if (!v) {
          return ErrorAt(name_pos, absl::StrCat(ctx, "missing required argument 'dims' ([2,3,4] "
                                                     "or [1,2,3,4])"));
        }
        if (v->boolean) return ErrorAt(v->column, absl::StrCat(ctx, "dims takes a list such as [2,3,4]"));
        for (const Token& t : v->numbers) {
          // Range-checked here, before the narrowing to int: [2,3,4] or [1,2,3,4] only.
          absl::StatusOr<int64_t> d = Integer(t, ctx, "dims", 0, 4);
          if (!d.ok()) return d.status();
          op->dims.push_back(static_cast<int>(*d));
        }
        break;
      }
      default:
        break;  // plain elementwise ops take no arguments
    }
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<Chain> ParseChain(std::string_view spec) {
  absl::StatusOr<Chain> chain = Parser(spec).Parse();
  if (!chain.ok()) return chain.status();
  if (absl::Status s = ValidateChain(*chain); !s.ok()) return s;
  return chain;
}

}  // namespace fusejit
