// codegen/tune_config.h: one configuration of a strategy's tunable parameters, and the one
// description of a strategy's parameters that produces its printed form, its baked constants and
// (through the generated source) its part of the cache key.
//
//   TuneConfig c = *TuneConfig::Parse("conv-moments-mean:threads=128,min_blocks=3,pw=6");
//   c.ToString() == "conv-moments-mean:threads=128,min_blocks=3,pw=6"
//
// A strategy keeps its parameters in a plain struct of int64_t members and lists them once in a
// TuneField table (name in the config text, constant in the generated source, member):
//
//   struct MyTune { int64_t threads = 128, pw = 6; };
//   constexpr TuneField<MyTune> kMyFields[] = {{"threads", "kThreads", &MyTune::threads},
//                                              {"pw", "kPW", &MyTune::pw}};
//   TuneConfig c = ToConfig("my-strategy", t, kMyFields);          // printed form
//   absl::StatusOr<MyTune> t = FromConfig<MyTune>(c, kMyFields);   // names checked, in order
//   TuneStruct s = ToTuneStruct("MyTune", t, kMyFields);          // baked constants
#ifndef FUSEJIT_CODEGEN_TUNE_CONFIG_H_
#define FUSEJIT_CODEGEN_TUNE_CONFIG_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "codegen/plan.h"

namespace fusejit::codegen {

// A strategy and a value for each of its tunable parameters, in the strategy's parameter order.
// Printed "STRATEGY" (no parameters) or "STRATEGY:NAME=VALUE,NAME=VALUE,..."; Parse(ToString())
// gives back an equal config. Names are [a-z0-9_]+, strategies [a-z0-9-]+, values decimal.
struct TuneConfig {
  std::string strategy;
  std::vector<std::pair<std::string, int64_t>> values;

  std::string ToString() const;
  // InvalidArgument naming the offending part ("tune config 'x': ... ") for malformed text.
  static absl::StatusOr<TuneConfig> Parse(std::string_view text);
  // The value of parameter `name`, if the config has one.
  std::optional<int64_t> Get(std::string_view name) const;
  // How many parameters differ (a parameter missing from either counts); another strategy: the
  // number of parameters of the larger config, plus one.
  int Distance(const TuneConfig& other) const;

  friend bool operator==(const TuneConfig&, const TuneConfig&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const TuneConfig& c) {
    return H::combine(std::move(h), c.strategy, c.values);
  }
};

// A tunable parameter and the values worth trying (a strategy's search space). The default
// configuration's value is always tried too, whether listed or not.
struct TuneParam {
  std::string name;
  std::vector<int64_t> values;
};

template <class T>
struct TuneField {
  std::string_view name;      // in the config text: "threads"
  std::string_view constant;  // in the generated TuneStruct: "kThreads"
  int64_t T::*member;
  bool is_bool = false;       // emitted as a bool constant; values 0 and 1 only
};

template <class T>
TuneConfig ToConfig(std::string_view strategy, const T& t, std::span<const TuneField<T>> fields) {
  TuneConfig c;
  c.strategy = std::string(strategy);
  for (const TuneField<T>& f : fields) c.values.emplace_back(std::string(f.name), t.*f.member);
  return c;
}

// The struct for `c`, starting from `defaults`. InvalidArgument unless c names exactly `fields`,
// in order (a bool field must be 0 or 1). Does not check the strategy name.
template <class T>
absl::StatusOr<T> FromConfig(const TuneConfig& c, std::span<const TuneField<T>> fields,
                             T defaults = T()) {
  std::string expected;
  for (const TuneField<T>& f : fields) {
    absl::StrAppend(&expected, expected.empty() ? "" : ",", std::string(f.name));
  }
  bool same = c.values.size() == fields.size();
  for (size_t i = 0; same && i < fields.size(); ++i) same = c.values[i].first == fields[i].name;
  if (!same) {
    return absl::InvalidArgumentError(absl::StrCat("tune config ", c.ToString(), ": ",
                                                   c.strategy, " takes the parameters ",
                                                   expected, " in that order"));
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    const int64_t v = c.values[i].second;
    if (fields[i].is_bool && v != 0 && v != 1) {
      return absl::InvalidArgumentError(absl::StrCat("tune config ", c.ToString(), ": ",
                                                     std::string(fields[i].name),
                                                     " is 0 or 1, not ", v));
    }
    defaults.*fields[i].member = v;
  }
  return defaults;
}

template <class T>
TuneStruct ToTuneStruct(std::string name, const T& t, std::span<const TuneField<T>> fields) {
  TuneStruct s;
  s.name = std::move(name);
  for (const TuneField<T>& f : fields) {
    const int64_t v = t.*f.member;
    s.fields.push_back({f.is_bool ? "bool" : "int", std::string(f.constant),
                        f.is_bool ? (v ? "true" : "false") : absl::StrCat(v)});
  }
  return s;
}

// The product of the parameters' values (each list deduplicated, the default's value added),
// every configuration passing `valid`, ordered by Distance() from `def`, ties in enumeration
// order; `def` first. At most `limit` configurations are enumerated (the product is cut off, the
// default kept). REQUIRES: def names the parameters of `space` in its order.
std::vector<TuneConfig> EnumerateConfigs(const TuneConfig& def, const std::vector<TuneParam>& space,
                                         const std::function<bool(const TuneConfig&)>& valid,
                                         size_t limit = 20000);

}  // namespace fusejit::codegen

#endif  // FUSEJIT_CODEGEN_TUNE_CONFIG_H_
