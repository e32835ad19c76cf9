// tools/progress.h: progress of a batch of tasks, on a stream: a bar redrawn in place on a
// terminal, plain lines otherwise (so that logs stay readable).
//
//   Progress progress(std::cerr, Progress::StyleFor(std::cerr), "prewarm", jobs.size());
//   ... on each worker: progress.Done(/*failed=*/!ok);
//   progress.Finish();
//
// Lines: one each time another 5% of the tasks is done (at most one a second), at least one
// every 30 seconds, and the final state. Bar: redrawn at most 10 times a second.
// Thread safety: Done, Note and Finish may be called from any thread.
#ifndef FUSEJIT_TOOLS_PROGRESS_H_
#define FUSEJIT_TOOLS_PROGRESS_H_

#include <chrono>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace fusejit::tools {

struct ProgressCounts {
  size_t done = 0;
  size_t total = 0;
  size_t failed = 0;
  double elapsed_s = 0;
};

// "[#########-----------]  52/120  43%  1 failed  3.1/s  0:17 elapsed  ~0:22 left", at most
// `width` characters (the bar shrinks first).
std::string FormatProgressBar(std::string_view label, const ProgressCounts& c, int width);
// "prewarm: 52/120 (43%), 1 failed, 3.1/s, 17.0 s elapsed, ~22 s left"
std::string FormatProgressLine(std::string_view label, const ProgressCounts& c);
// "0:17", "1:02:03"
std::string FormatClock(double seconds);

class Progress {
 public:
  enum class Style { kBar, kLines, kOff };
  // kBar when `stream` is std::cerr, stderr is a terminal and TERM is not "dumb"; else kLines.
  static Style StyleFor(const std::ostream& stream);

  Progress(std::ostream& stream, Style style, std::string label, size_t total);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Done(bool failed);
  // Prints `line` (one line, no newline) without breaking the bar.
  void Note(std::string_view line);
  // Draws the final state and ends the bar's line. Further calls print nothing.
  void Finish();

 private:
  using Clock = std::chrono::steady_clock;
  ProgressCounts CountsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrawLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::ostream& stream_;
  const Style style_;
  const std::string label_;
  const int width_;
  const Clock::time_point start_ = Clock::now();

  absl::Mutex mu_;
  size_t total_ ABSL_GUARDED_BY(mu_);
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  size_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool bar_shown_ ABSL_GUARDED_BY(mu_) = false;
  size_t printed_step_ ABSL_GUARDED_BY(mu_) = 0;  // lines: last 5% step printed
  size_t printed_done_ ABSL_GUARDED_BY(mu_) = static_cast<size_t>(-1);
  Clock::time_point last_draw_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_PROGRESS_H_
