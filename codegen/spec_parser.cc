// The spec grammar (whitespace is free between tokens):
//   spec   := input ('|' op)*
//   input  := 'x' ':' dtype '[' int (',' int)* ']'      dtype := f32 | f16 | bf16 | f64
//   op     := name ['(' [arg (',' arg)*] ')']
//   arg    := name '=' value
//   value  := number | 'true' | 'false' | '[' number (',' number)* ']'
// Errors give the column (1-based) and say what would be valid there.
#include <charconv>
#include <cctype>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fusejit/chain.h"

namespace fusejit {
namespace {

struct Value {
  std::vector<double> numbers;  // one for a scalar; several for a list
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
    if (absl::Status s = ParseInput(&chain.input, &chain.dtype); !s.ok()) return s;
    while (true) {
      SkipSpace();
      if (pos_ == text_.size()) break;
      if (!Consume('|')) return Error("expected '|' between ops");
      Op op;
      if (absl::Status s = ParseOp(chain.ops.size(), &op); !s.ok()) return s;
      chain.ops.push_back(std::move(op));
    }
    return chain;
  }

 private:
  absl::Status Error(std::string_view what) const { return ErrorAt(pos_, what); }
  absl::Status ErrorAt(size_t pos, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("spec column ", pos + 1, ": ", std::string(what), " (in \"", std::string(text_), "\")"));
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

  absl::StatusOr<double> Number() {
    SkipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.' ||
            text_[pos_] == '-' || text_[pos_] == '+')) {
      ++pos_;
    }
    std::string_view tok = text_.substr(start, pos_ - start);
    if (!tok.empty() && tok[0] == '+') tok.remove_prefix(1);
    double v = 0;
    auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (tok.empty() || ec != std::errc() || end != tok.data() + tok.size()) {
      return ErrorAt(start, absl::StrCat("expected a number, found '", std::string(tok), "'"));
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
      return ErrorAt(dtype_pos, absl::StrCat("input type '", dtype,
                                             "' is not a dtype; write f32, f16, bf16 or f64"));
    }
    if (!Consume('[')) {
      return Error(absl::StrCat("expected '[' and the input shape after x:", dtype));
    }
    do {
      SkipSpace();
      size_t at = pos_;
      absl::StatusOr<double> v = Number();
      if (!v.ok()) return v.status();
      if (*v != static_cast<double>(static_cast<int64_t>(*v)) || *v > 9e18) {
        return ErrorAt(at, "input sizes must be whole numbers");
      }
      shape->push_back(static_cast<int64_t>(*v));
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
        absl::StatusOr<double> n = Number();
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
      absl::StatusOr<double> n = Number();
      if (!n.ok()) return n.status();
      v->numbers.push_back(*n);
    }
    v->text = std::string(text_.substr(start, pos_ - start));
    return absl::OkStatus();
  }

  absl::Status ParseOp(size_t index, Op* op) {
    SkipSpace();
    size_t name_pos = pos_;
    std::string name = Identifier();
    static const std::map<std::string, OpKind> kKinds = {
        {"conv3d", OpKind::kConv3d},       {"conv_transpose3d", OpKind::kConvTranspose3d},
        {"relu", OpKind::kRelu},           {"leaky_relu", OpKind::kLeakyRelu},
        {"sigmoid", OpKind::kSigmoid},     {"tanh", OpKind::kTanh},
        {"swish", OpKind::kSwish},         {"silu", OpKind::kSwish},
        {"hardswish", OpKind::kHardswish}, {"gelu", OpKind::kGelu},
        {"clamp", OpKind::kClamp},         {"group_norm", OpKind::kGroupNorm},
        {"mean", OpKind::kMean}};
    auto it = kKinds.find(name);
    if (it == kKinds.end()) {
      return ErrorAt(name_pos,
                     absl::StrCat(name.empty() ? std::string("missing op") : "unknown op '" + name + "'",
                                  "; ops are conv3d, conv_transpose3d, relu, leaky_relu, sigmoid, "
                                  "tanh, swish (silu), hardswish, gelu, clamp, group_norm, mean"));
    }
    op->kind = it->second;
    std::map<std::string, Value> args;
    std::vector<std::string> order;
    if (Consume('(')) {
      if (!Consume(')')) {
        do {
          SkipSpace();
          size_t arg_pos = pos_;
          std::string key = Identifier();
          if (key.empty()) return Error("expected an argument name, e.g. k=3");
          if (!Consume('=')) return Error(absl::StrCat("expected '=' after argument '", key, "'"));
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
    auto integer = [&](const Value& v, const char* key, double x, int64_t* out) -> absl::Status {
      if (x != static_cast<double>(static_cast<int64_t>(x)) || x > 1e15 || x < -1e15) {
        return ErrorAt(v.column, absl::StrCat(ctx, key, "=", v.text, " must be a whole number"));
      }
      *out = static_cast<int64_t>(x);
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
      return integer(*v, key, v->numbers[0], out);
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
        double x = v->is_list ? v->numbers[a] : v->numbers[0];
        if (absl::Status s = integer(*v, key, x, &(*out)[a]); !s.ok()) return s;
      }
      return absl::OkStatus();
    };
    auto real = [&](const char* key, double* out, bool required) -> absl::Status {
      Value* v = take(key);
      if (!v) {
        return required ? ErrorAt(name_pos, absl::StrCat(ctx, "missing required argument '",
                                                         key, "'"))
                        : absl::OkStatus();
      }
      if (v->is_list || v->boolean) return ErrorAt(v->column, absl::StrCat(ctx, key, " takes a number"));
      *out = v->numbers[0];
      return absl::OkStatus();
    };

    std::vector<std::string> known;
    absl::Status s;
    switch (op->kind) {
      case OpKind::kConv3d:
      case OpKind::kConvTranspose3d: {
        const bool transposed = op->kind == OpKind::kConvTranspose3d;
        known = {"out", "k", "stride", "padding", "dilation", "bias"};
        if (transposed) known.push_back("output_padding");
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
        known = {"slope", "negative_slope"};
        if (s = real("slope", &op->slope, false); !s.ok()) return s;
        if (s = real("negative_slope", &op->slope, false); !s.ok()) return s;
        break;
      case OpKind::kClamp:
        known = {"min", "max"};
        if (s = real("min", &op->min, true); !s.ok()) return s;
        if (s = real("max", &op->max, true); !s.ok()) return s;
        break;
      case OpKind::kGroupNorm:
        known = {"groups", "eps"};
        if (s = scalar_int("groups", &op->groups, true); !s.ok()) return s;
        if (s = real("eps", &op->eps, false); !s.ok()) return s;
        break;
      case OpKind::kMean: {
        known = {"dims", "dim"};
        Value* v = take("dims");
        if (!v) v = take("dim");
        if (!v) {
          return ErrorAt(name_pos, absl::StrCat(ctx, "missing required argument 'dims' ([2,3,4] "
                                                     "or [1,2,3,4])"));
        }
        for (double x : v->numbers) {
          int64_t d = 0;
          if (s = integer(*v, "dims", x, &d); !s.ok()) return s;
          op->dims.push_back(static_cast<int>(d));
        }
        break;
      }
      default:
        break;  // plain elementwise ops take no arguments
    }
    for (const auto& [key, value] : args) {
      if (key == "output_padding" && op->kind == OpKind::kConv3d) {
        return ErrorAt(value.column, absl::StrCat(ctx, "output_padding applies to "
                                                       "conv_transpose3d only"));
      }
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return ErrorAt(value.column - key.size() - 1,
                       absl::StrCat(ctx, "unknown argument '", key, "'",
                                    known.empty() ? std::string("; ") + name + " takes none"
                                                  : "; valid: " + absl::StrJoin(known, ", ")));
      }
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
