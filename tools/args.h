// tools/args.h: the CLI's argument parser. Small on purpose: each command declares its flags in a
// CommandSpec, ParseArgs checks the words against it, and the help text comes from the same table.
//
//   --flag VALUE and --flag=VALUE   a flag that takes a value
//   --switch                        a flag without a value (--switch=x is refused)
//   --flag A --flag B               only for flags marked `repeated`; others may appear once
//   --                              everything after it is positional
//   anything else                   positional (a lone "-" included)
//
// Unknown flags are refused with an error naming the flag and listing the valid ones. --help (and
// -h) is always accepted and only sets ParsedArgs::help, so `cmd --help` works even when the rest
// of the command line is incomplete.
//
// Thread safety: pure functions over values; no global state.
#ifndef FUSEJIT_TOOLS_ARGS_H_
#define FUSEJIT_TOOLS_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fusejit::tools {

struct FlagSpec {
  std::string name = "";        // without the dashes: "seed"
  std::string value_name = "";  // "N", "FILE.npy"; empty: a switch that takes no value
  std::string help = "";        // one line
  bool repeated = false;        // may be given more than once (values kept in order)
};

struct CommandSpec {
  std::string name = "";        // "fusejit run"
  std::string positional = "";  // "SPEC" for the usage line; empty: none
  int min_positional = 0;
  int max_positional = 0;
  std::string summary = "";      // one line, for the top-level help
  std::string description = "";  // paragraphs after the usage line
  std::vector<FlagSpec> flags = {};
};

class ParsedArgs {
 public:
  bool help = false;
  std::vector<std::string> positional;

  // Whether the flag (switch or valued) was given at least once.
  bool Has(std::string_view name) const { return values_.count(std::string(name)) > 0; }
  // The flag's value, if given (a switch has the value "").
  std::optional<std::string> Get(std::string_view name) const;
  // Every value of a repeated flag, in command-line order; empty if not given.
  std::vector<std::string> GetAll(std::string_view name) const;

  void Add(const std::string& name, std::string value) {
    values_[name].push_back(std::move(value));
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// Parses `args` (the words after the command name) against `spec`. Errors (InvalidArgument, one
// line, naming the flag): unknown flag (listing the valid ones), missing value, value given to a
// switch, a non-repeated flag given twice, too few or too many positional arguments (unless
// --help was given, which skips the positional count check).
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args, const CommandSpec& spec);

// "usage: fusejit run SPEC [flags]", the description and one line per flag (and --help).
std::string FormatHelp(const CommandSpec& spec);

// Typed flag values. Errors name the flag and the text: "--seed: 'x' is not an integer".
absl::StatusOr<int64_t> ParseIntFlag(const std::string& flag, const std::string& text, int64_t min,
                                     int64_t max);
absl::StatusOr<double> ParseDoubleFlag(const std::string& flag, const std::string& text);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_ARGS_H_
