#include "tools/args.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fmt/format.h"

namespace fusejit::tools {
namespace {

const FlagSpec* FindFlag(const CommandSpec& spec, std::string_view name) {
  for (const FlagSpec& f : spec.flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string ValidFlags(const CommandSpec& spec) {
  std::vector<std::string> names;
  for (const FlagSpec& f : spec.flags) names.push_back("--" + f.name);
  names.push_back("--help");
  return absl::StrJoin(names, ", ");
}

std::string FlagUsage(const FlagSpec& f) {
  return f.value_name.empty() ? "--" + f.name : absl::StrCat("--", f.name, " ", f.value_name);
}

}  // namespace

std::optional<std::string> ParsedArgs::Get(std::string_view name) const {
  auto it = values_.find(std::string(name));
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(std::string_view name) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const CommandSpec& spec) {
  ParsedArgs parsed;
  bool only_positional = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (only_positional || word.size() < 2 || word[0] != '-' || (word[1] != '-' && word != "-h")) {
      parsed.positional.push_back(word);
      continue;
    }
    if (word == "--") {
      only_positional = true;
      continue;
    }
    if (word == "--help" || word == "-h") {
      parsed.help = true;
      continue;
    }
    const size_t eq = word.find('=');
    const std::string name = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const FlagSpec* flag = FindFlag(spec, name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " for '", spec.name,
                                                     "'; valid flags: ", ValidFlags(spec)));
    }
    if (parsed.Has(name) && !flag->repeated) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " is given more than once; it takes one value"));
    }
    if (flag->value_name.empty()) {
      if (eq != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " is a switch and takes no value (got '", word, "')"));
      }
      parsed.Add(name, "");
      continue;
    }
    if (eq != std::string::npos) {
      parsed.Add(name, word.substr(eq + 1));
      continue;
    }
    // A following word that looks like a flag is not taken as the value: "--output --check" is
    // far more likely a forgotten value than a file named "--check".
    if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value (", FlagUsage(*flag), ")"));
    }
    parsed.Add(name, args[++i]);
  }
  if (!parsed.help) {
    const int n = static_cast<int>(parsed.positional.size());
    if (n < spec.min_positional) {
      return absl::InvalidArgumentError(absl::StrCat("missing argument ", spec.positional));
    }
    if (n > spec.max_positional) {
      const std::string& extra = parsed.positional[spec.max_positional];
      return absl::InvalidArgumentError(
          spec.max_positional == 0
              ? absl::StrCat("unexpected argument '", extra, "'; '", spec.name,
                             "' takes no positional arguments")
              : absl::StrCat("unexpected extra argument '", extra, "' after ", spec.positional,
                             " (quote the spec: it contains spaces and '|')"));
    }
  }
  return parsed;
}

std::string FormatHelp(const CommandSpec& spec) {
  std::string s = absl::StrCat("usage: ", spec.name);
  if (!spec.positional.empty()) absl::StrAppend(&s, " ", spec.positional);
  absl::StrAppend(&s, " [flags]\n\n", spec.summary, "\n");
  if (!spec.description.empty()) absl::StrAppend(&s, "\n", spec.description);
  absl::StrAppend(&s, "\nflags:\n");
  size_t width = 6;  // "--help"
  for (const FlagSpec& f : spec.flags) width = std::max(width, FlagUsage(f).size());
  for (const FlagSpec& f : spec.flags) {
    absl::StrAppend(&s, fmt::format("  {:<{}}  {}{}\n", FlagUsage(f), width, f.help,
                                    f.repeated ? " (repeatable)" : ""));
  }
  absl::StrAppend(&s, fmt::format("  {:<{}}  {}\n", "--help", width, "print this help"));
  return s;
}

absl::StatusOr<int64_t> ParseIntFlag(const std::string& flag, const std::string& text, int64_t min,
                                     int64_t max) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", text, "' is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", value, " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<double> ParseDoubleFlag(const std::string& flag, const std::string& text) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", text, "' is not a finite non-negative number"));
  }
  return value;
}

}  // namespace fusejit::tools
