#include "tools/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"

namespace fusejit::tools {
namespace {

int TerminalWidth() {
  struct winsize ws {};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
  return 80;
}

double Rate(const ProgressCounts& c) { return c.elapsed_s > 0 ? c.done / c.elapsed_s : 0; }

// Seconds left at the current rate; negative when unknown.
double SecondsLeft(const ProgressCounts& c) {
  const double rate = Rate(c);
  if (c.done == 0 || rate <= 0 || c.done >= c.total) return -1;
  return (c.total - c.done) / rate;
}

int Percent(const ProgressCounts& c) {
  return c.total == 0 ? 100 : static_cast<int>(100 * c.done / c.total);
}

constexpr size_t kLineSteps = 20;  // a line per 5%
constexpr double kMinLineGapS = 1;
constexpr double kMaxLineGapS = 30;
constexpr double kBarRedrawS = 0.1;

}  // namespace

std::string FormatClock(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string FormatProgressBar(std::string_view label, const ProgressCounts& c, int width) {
  const int digits = static_cast<int>(std::to_string(c.total).size());
  std::string tail = fmt::format("  {:>{}}/{}  {:3}%", c.done, digits, c.total, Percent(c));
  if (c.failed > 0) absl::StrAppend(&tail, fmt::format("  {} failed", c.failed));
  if (c.done > 0) absl::StrAppend(&tail, fmt::format("  {:.1f}/s", Rate(c)));
  absl::StrAppend(&tail, "  ", FormatClock(c.elapsed_s));
  if (const double left = SecondsLeft(c); left >= 0) {
    absl::StrAppend(&tail, "  ~", FormatClock(left), " left");
  }
  const std::string head = std::string(label) + " ";
  // The tail's width varies (rates, "left" at the end): reserve room for its widest form so that
  // the bar keeps its length from one redraw to the next.
  const int reserved = std::max<int>(static_cast<int>(tail.size()), 2 * digits + 50);
  const int bar = std::min<int>(40, width - static_cast<int>(head.size()) - reserved - 2);
  if (bar < 5) return (head + tail).substr(0, std::max(0, width));
  const int filled = c.total == 0 ? bar : static_cast<int>(bar * c.done / c.total);
  return absl::StrCat(head, "[", std::string(filled, '#'), std::string(bar - filled, '-'), "]",
                      tail);
}

std::string FormatProgressLine(std::string_view label, const ProgressCounts& c) {
  std::string line = fmt::format("{}: {}/{} ({}%)", label, c.done, c.total, Percent(c));
  if (c.failed > 0) absl::StrAppend(&line, fmt::format(", {} failed", c.failed));
  absl::StrAppend(&line, fmt::format(", {:.1f}/s, {:.1f} s elapsed", Rate(c), c.elapsed_s));
  if (const double left = SecondsLeft(c); left >= 0) {
    absl::StrAppend(&line, fmt::format(", ~{:.0f} s left", left));
  }
  return line;
}

Progress::Style Progress::StyleFor(const std::ostream& stream) {
  if (&stream != &std::cerr || !isatty(STDERR_FILENO)) return Style::kLines;
  const char* term = std::getenv("TERM");
  if (term != nullptr && std::string_view(term) == "dumb") return Style::kLines;
  return Style::kBar;
}

Progress::Progress(std::ostream& stream, Style style, std::string label, size_t total)
    : stream_(stream),
      style_(style),
      label_(std::move(label)),
      width_(style == Style::kBar ? TerminalWidth() : 80),
      total_(total),
      last_draw_(start_) {}

ProgressCounts Progress::CountsLocked() const {
  return {done_, total_, failed_,
          std::chrono::duration<double>(Clock::now() - start_).count()};
}

void Progress::DrawLocked(bool force) {
  if (finished_ || style_ == Style::kOff) return;
  const Clock::time_point now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  const ProgressCounts c = CountsLocked();
  if (style_ == Style::kBar) {
    if (!force && bar_shown_ && since < kBarRedrawS) return;
    stream_ << "\r" << FormatProgressBar(label_, c, width_ - 1) << "\x1b[K" << std::flush;
    bar_shown_ = true;
  } else {
    const size_t step = c.total == 0 ? kLineSteps : c.done * kLineSteps / c.total;
    const bool due = (step > printed_step_ && since >= kMinLineGapS) || since >= kMaxLineGapS;
    if (!(force || due) || c.done == printed_done_) return;
    stream_ << FormatProgressLine(label_, c) << "\n" << std::flush;
    printed_step_ = step;
    printed_done_ = c.done;
  }
  last_draw_ = now;
}

void Progress::Done(bool failed) {
  absl::MutexLock lock(&mu_);
  ++done_;
  if (failed) ++failed_;
  DrawLocked(/*force=*/false);
}

void Progress::Note(std::string_view line) {
  absl::MutexLock lock(&mu_);
  if (style_ == Style::kBar && bar_shown_ && !finished_) {
    stream_ << "\r\x1b[K" << line << "\n";
    DrawLocked(/*force=*/true);
  } else {
    stream_ << line << "\n" << std::flush;
  }
}

void Progress::Finish() {
  absl::MutexLock lock(&mu_);
  if (finished_) return;
  DrawLocked(/*force=*/true);
  if (style_ == Style::kBar && bar_shown_) stream_ << "\n" << std::flush;
  finished_ = true;
}

}  // namespace fusejit::tools
