#include "codegen/tune_config.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fusejit::codegen {
namespace {

bool IsNameChar(char c, bool dash) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || (dash && c == '-');
}

bool IsName(std::string_view s, bool dash) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return IsNameChar(c, dash); });
}

}  // namespace

std::string TuneConfig::ToString() const {
  if (values.empty()) return strategy;
  std::vector<std::string> parts;
  for (const auto& [name, value] : values) parts.push_back(absl::StrCat(name, "=", value));
  return absl::StrCat(strategy, ":", absl::StrJoin(parts, ","));
}

absl::StatusOr<TuneConfig> TuneConfig::Parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tune config '", std::string(text), "': ", std::string(why),
        " (expected STRATEGY or STRATEGY:NAME=VALUE,..., e.g. conv-moments-mean:threads=128,pw=6)"));
  };
  TuneConfig c;
  const size_t colon = text.find(':');
  c.strategy = std::string(text.substr(0, colon));
  if (!IsName(c.strategy, /*dash=*/true)) return bad("the strategy name is not [a-z0-9-]+");
  if (colon == std::string_view::npos) return c;
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(text.data() + colon + 1, text.size() - colon - 1), ',')) {
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) return bad(absl::StrCat("'", part, "' is not NAME=VALUE"));
    const std::string name(part.substr(0, eq));
    if (!IsName(name, /*dash=*/false)) return bad(absl::StrCat("'", name, "' is not [a-z0-9_]+"));
    int64_t value = 0;
    const absl::string_view digits = part.substr(eq + 1);
    if (digits.empty() || digits.front() == '+' || !absl::SimpleAtoi(digits, &value)) {
      return bad(absl::StrCat("the value of ", name, " is not an integer"));
    }
    if (!seen.insert(name).second) return bad(absl::StrCat(name, " is given twice"));
    c.values.emplace_back(name, value);
  }
  return c;
}

std::optional<int64_t> TuneConfig::Get(std::string_view name) const {
  for (const auto& [n, v] : values) {
    if (n == name) return v;
  }
  return std::nullopt;
}

int TuneConfig::Distance(const TuneConfig& other) const {
  if (strategy != other.strategy) {
    return static_cast<int>(std::max(values.size(), other.values.size())) + 1;
  }
  int d = 0;
  for (const auto& [name, value] : values) {
    const std::optional<int64_t> o = other.Get(name);
    d += (!o.has_value() || *o != value) ? 1 : 0;
  }
  for (const auto& [name, value] : other.values) d += Get(name).has_value() ? 0 : 1;
  return d;
}

std::vector<TuneConfig> EnumerateConfigs(const TuneConfig& def, const std::vector<TuneParam>& space,
                                         const std::function<bool(const TuneConfig&)>& valid,
                                         size_t limit) {
  // Each parameter's values, deduplicated, in the order given, the default's value first.
  std::vector<std::vector<int64_t>> lists;
  for (size_t i = 0; i < space.size(); ++i) {
    std::vector<int64_t> list;
    if (i < def.values.size()) list.push_back(def.values[i].second);
    for (int64_t v : space[i].values) {
      if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
    }
    lists.push_back(std::move(list));
  }
  std::vector<TuneConfig> out;
  std::vector<size_t> index(lists.size(), 0);
  for (size_t count = 0; count < limit; ++count) {
    TuneConfig c;
    c.strategy = def.strategy;
    for (size_t i = 0; i < lists.size(); ++i) c.values.emplace_back(space[i].name, lists[i][index[i]]);
    if (count == 0 || valid(c)) out.push_back(std::move(c));  // the first is the default
    // Odometer, last parameter fastest.
    bool done = true;
    for (size_t k = lists.size(); k-- > 0;) {
      if (++index[k] < lists[k].size()) {
        done = false;
        break;
      }
      index[k] = 0;
    }
    if (done) break;
  }
  std::stable_sort(out.begin() + (out.empty() ? 0 : 1), out.end(),
                   [&](const TuneConfig& a, const TuneConfig& b) {
                     return a.Distance(def) < b.Distance(def);
                   });
  return out;
}

}  // namespace fusejit::codegen
