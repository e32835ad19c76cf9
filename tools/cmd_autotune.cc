// fusejit autotune SPEC... | --manifest FILE: measure each chain's launch configurations on
// device 0, store the fastest in the tuning database, print a table.
#include <chrono>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "codegen/planner.h"
#include "fmt/format.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "jit/device.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/manifest.h"
#include "tools/progress.h"
#include "tune/tuner.h"
#include "tune/tuning_db.h"

namespace fusejit::tools {
namespace {

struct Job {
  Chain chain;
  std::string spec;   // canonical
  std::string where;  // "argument 2", "FILE:LINE"
};

struct Row {
  const Job* job = nullptr;
  std::optional<tune::TuneResult> result;
  std::string error;   // tuning failed
  std::string stored;  // "yes", "no (why)", "dry run"
  bool in_use = false;  // a fresh lookup returns the stored configuration
};

std::string Ms(double ms) { return std::isfinite(ms) ? fmt::format("{:.4f}", ms) : "-"; }

// "<tried>/<rejected>" plus failures when there were any.
std::string Tried(const tune::TuneResult& r) {
  std::string s = fmt::format("{}/{}", r.tried, r.rejected);
  if (r.failed > 0) s += fmt::format(" ({} failed)", r.failed);
  return s;
}

void PrintTable(std::ostream& out, const std::vector<Row>& rows) {
  out << "\n| # | where | chain | default ms | tuned ms | speedup | tried/rejected | space | "
         "tuning s | config |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (!row.result.has_value()) {
      out << fmt::format("| {} | {} | `{}` | - | - | - | - | - | - | failed: {} |\n", i + 1,
                         row.job->where, row.job->spec, row.error);
      continue;
    }
    const tune::TuneResult& r = *row.result;
    const bool is_default = r.best_config == r.default_config;
    out << fmt::format("| {} | {} | `{}` | {} | {} | {:.2f}x | {} | {}{} | {:.1f} | `{}`{} |\n",
                       i + 1, row.job->where, row.job->spec, Ms(r.default_ms), Ms(r.best_ms), r.speedup(), Tried(r),
                       r.space, r.budget_exhausted ? "" : " (all)", r.seconds, r.best_config,
                       is_default ? " (default)" : "");
  }
}

}  // namespace

const CommandSpec& AutotuneSpec() {
  static const auto* spec = new CommandSpec{
      .name = "fusejit autotune",
      .positional = "[SPEC...]",
      .min_positional = 0,
      .max_positional = 1000000,
      .summary = "measure launch configurations on the GPU; remember the fastest per chain",
      .description =
          "For each chain (the SPECs, then the --manifest's, the format of `fusejit prewarm`):\n"
          "measures its launch configurations on device 0 -- every applicable plan strategy and\n"
          "each one's tunable parameters (threads, outputs per thread, blocks per sample,\n"
          "reduction chunks, min blocks per SM, ...) -- starting from the heuristic default,\n"
          "climbing to better neighbours, then trying the rest by distance while --budget-s\n"
          "lasts. Candidates are compiled on CPU threads while the GPU times the ones already\n"
          "built (median of --reps CUDA-event timings, L2 flushed before each). A candidate\n"
          "whose output differs from the default configuration's (relative L2 over 1e-5 or 4x\n"
          "the default's own error against the float64 reference, whichever is larger; or any\n"
          "non-finite value) is rejected. The default and the fastest few are timed again,\n"
          "interleaved; the fastest there is stored in the tuning database beside the kernel\n"
          "cache, keyed by chain, device name, SM count, driver and fusejit version. Later\n"
          "compiles of the chain for this kind of GPU use it (`fusejit explain` shows\n"
          "\"config:\"); FUSEJIT_DISABLE_TUNING=1 ignores the database. Ends with a table.\n",
      .flags =
          {
              {"manifest", "FILE", "also tune the chains of this manifest (one spec a line)",
               /*repeated=*/true},
              {"budget-s", "N", "search time per chain in seconds (default 8)"},
              {"max-candidates", "N", "most configurations measured per chain (default: no limit)"},
              {"reps", "N", "timed runs per candidate (default 10)"},
              {"threads", "N", "compile threads (default: all cores)"},
              PrecisionFlag(),
              {"seed", "N", "seed of the random inputs (default 0)"},
              {"no-store", "", "measure only; leave the tuning database alone"},
              {"verbose", "", "print every candidate's result"},
          },
  };
  return *spec;
}

int AutotuneCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const CommandSpec& spec = AutotuneSpec();
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, spec);
  if (!parsed.ok()) return UsageError(err, spec, parsed.status().message());
  if (parsed->help) {
    out << FormatHelp(spec);
    return kExitOk;
  }
  std::vector<Job> jobs;
  size_t invalid_specs = 0;  // in manifests: reported, the others tuned, exit 2 at the end
  for (size_t i = 0; i < parsed->positional.size(); ++i) {
    absl::StatusOr<Chain> chain = ParseChain(parsed->positional[i]);
    if (!chain.ok()) {
      return UsageError(err, spec, absl::StrCat("argument ", i + 1, ": ", chain.status().message()));
    }
    jobs.push_back({*chain, FormatChain(*chain), absl::StrCat("argument ", i + 1)});
  }
  for (const std::string& path : parsed->GetAll("manifest")) {
    absl::StatusOr<Manifest> manifest = ReadManifest(path);
    if (!manifest.ok()) return InputError(err, spec, manifest.status());
    for (const std::string& e : manifest->errors) err << e << "\n";
    invalid_specs += manifest->invalid_specs;
    for (const ManifestEntry& e : manifest->entries) jobs.push_back({e.chain, e.spec, e.location});
  }
  if (jobs.empty()) return UsageError(err, spec, "no chains: give SPECs or --manifest FILE");

  tune::TuneOptions options;
  if (auto v = parsed->Get("budget-s")) {
    absl::StatusOr<double> b = ParseDoubleFlag("budget-s", *v);
    if (!b.ok() || !(*b >= 0)) {
      return UsageError(err, spec, b.ok() ? "--budget-s: must be >= 0" : b.status().message());
    }
    options.budget_s = *b;
  }
  for (auto [flag, target, lo] : {std::tuple{"max-candidates", &options.max_candidates, 1},
                                  std::tuple{"reps", &options.reps, 1},
                                  std::tuple{"threads", &options.compile_threads, 1}}) {
    if (auto v = parsed->Get(flag)) {
      absl::StatusOr<int64_t> n = ParseIntFlag(flag, *v, lo, 1000000);
      if (!n.ok()) return UsageError(err, spec, n.status().message());
      *target = static_cast<int>(*n);
    }
  }
  if (auto v = parsed->Get("seed")) {
    absl::StatusOr<int64_t> n = ParseIntFlag("seed", *v, 0, int64_t{1} << 62);
    if (!n.ok()) return UsageError(err, spec, n.status().message());
    options.seed = static_cast<uint64_t>(*n);
  }
  absl::StatusOr<Precision> precision = PrecisionFromFlags(*parsed);
  if (!precision.ok()) return UsageError(err, spec, precision.status().message());
  options.precision = *precision;
  const bool store = !parsed->Has("no-store");
  const bool verbose = parsed->Has("verbose");

  absl::StatusOr<jit::ScopedPrimaryContext> context = jit::ScopedPrimaryContext::Create(0);
  if (!context.ok()) return Failure(err, spec, context.status().message());
  absl::StatusOr<jit::DeviceInfo> device = jit::CurrentDeviceInfo();
  if (!device.ok()) return Failure(err, spec, device.status().message());
  tune::TuningDb& db = tune::TuningDb::Default();
  out << fmt::format("device: {} ({}, {} SMs, driver {}); budget {} s per chain{}; tuning "
                     "database: {}\n",
                     device->name, device->arch, device->sm_count, device->driver_version,
                     options.budget_s,
                     options.max_candidates > 0
                         ? fmt::format(", at most {} candidates", options.max_candidates)
                         : "",
                     !store ? "not written (--no-store)"
                            : (db.usable() ? db.directory() : "none (nothing will be stored)"));
  out.flush();

  Progress progress(err, Progress::StyleFor(err), "autotune", jobs.size());
  std::vector<Row> rows;
  bool all_ok = true;
  for (const Job& job : jobs) {
    Row row;
    row.job = &job;
    tune::TuneOptions o = options;
    if (verbose) {
      o.on_candidate = [&](const tune::CandidateResult& c) {
        progress.Note(fmt::format("  {:<13} {:>10} rel_l2 {:.1e}  {}{}",
                                  c.screened ? "timed (3 runs)" : tune::OutcomeName(c.outcome),
                                  c.outcome == tune::CandidateResult::Outcome::kTimed
                                      ? Ms(c.median_ms) + " ms"
                                      : "",
                                  c.rel_l2, c.config, c.error.empty() ? "" : "  " + c.error));
      };
    }
    absl::StatusOr<tune::TuneResult> result = tune::TuneChain(job.chain, o);
    if (!result.ok()) {
      row.error = std::string(result.status().message());
      all_ok = false;
      progress.Note(fmt::format("{}: {}: tuning failed: {}", job.where, job.spec, row.error));
      progress.Done(/*failed=*/true);
      rows.push_back(std::move(row));
      continue;
    }
    for (const tune::CandidateResult& c : result->candidates) {
      if (c.outcome == tune::CandidateResult::Outcome::kMismatch) {
        progress.Note(fmt::format("  rejected (output differs from the default's: rel_l2 {:.2e} > "
                                  "{:.1e}, {} non-finite): {}",
                                  c.rel_l2, result->tolerance, c.non_finite, c.config));
      } else if (c.outcome != tune::CandidateResult::Outcome::kTimed && !verbose) {
        progress.Note(fmt::format("  {}: {}: {}", tune::OutcomeName(c.outcome), c.config, c.error));
      }
    }
    if (store) {
      absl::Status s = db.Store(result->ToRecord());
      row.stored = s.ok() ? "yes" : std::string(s.message());
      if (s.ok()) {
        codegen::PlanTarget target{result->arch, result->device.sm_count, result->precision};
        std::optional<codegen::TuneConfig> found = db.Find(job.chain, target, result->device);
        row.in_use = found.has_value() && found->ToString() == result->best_config;
      }
    } else {
      row.stored = "dry run";
    }
    progress.Note(fmt::format(
        "{}: {:.4f} -> {:.4f} ms ({:.2f}x), {} tried, {} rejected (tolerance {:.1e}{}), {:.1f} "
        "s{}: {}",
        job.where, result->default_ms, result->best_ms, result->speedup(), result->tried,
        result->rejected, result->tolerance,
        result->default_error >= 0
            ? fmt::format("; default vs float64 {:.1e}", result->default_error)
            : "",
        result->seconds,
        store ? (row.in_use ? ", stored" : fmt::format(", NOT stored: {}", row.stored)) : "",
        result->best_config));
    if (store && !row.in_use) all_ok = false;
    row.result = *std::move(result);
    progress.Done(/*failed=*/false);
    rows.push_back(std::move(row));
  }
  progress.Finish();
  PrintTable(out, rows);
  if (invalid_specs > 0) {
    err << fmt::format("{}: {} invalid specs in the manifests (listed above)\n", spec.name,
                       invalid_specs);
    return kExitUsage;
  }
  return all_ok ? kExitOk : kExitFailure;
}

}  // namespace fusejit::tools
