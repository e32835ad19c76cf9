// The progress display of `fusejit prewarm` (tools/progress.h): bar and line formats, and the
// Progress object writing lines to a stream that is not a terminal.
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/progress.h"

namespace fusejit::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(PrewarmProgressTest, ClockFormat) {
  EXPECT_EQ(FormatClock(0), "0:00");
  EXPECT_EQ(FormatClock(17.4), "0:17");
  EXPECT_EQ(FormatClock(62), "1:02");
  EXPECT_EQ(FormatClock(3723), "1:02:03");
}

TEST(PrewarmProgressTest, LineSaysDoneTotalFailedRateAndTimeLeft) {
  EXPECT_EQ(FormatProgressLine("prewarm", {.done = 30, .total = 120, .failed = 2, .elapsed_s = 10}),
            "prewarm: 30/120 (25%), 2 failed, 3.0/s, 10.0 s elapsed, ~30 s left");
  EXPECT_EQ(FormatProgressLine("prewarm", {.done = 4, .total = 4, .failed = 0, .elapsed_s = 2}),
            "prewarm: 4/4 (100%), 2.0/s, 2.0 s elapsed");
}

TEST(PrewarmProgressTest, BarKeepsItsLengthAndFitsTheWidth) {
  const std::string a =
      FormatProgressBar("prewarm", {.done = 1, .total = 120, .failed = 0, .elapsed_s = 1}, 100);
  const std::string b =
      FormatProgressBar("prewarm", {.done = 120, .total = 120, .failed = 3, .elapsed_s = 70}, 100);
  EXPECT_THAT(a, HasSubstr("prewarm [---"));
  EXPECT_THAT(a, HasSubstr("   1/120    0%"));
  EXPECT_THAT(a, HasSubstr("~"));  // time left
  EXPECT_THAT(b, HasSubstr("120/120  100%  3 failed"));
  EXPECT_THAT(b, Not(HasSubstr("left")));
  EXPECT_EQ(a.find(']'), b.find(']'));  // the same bar length
  for (int width : {20, 40, 80, 200}) {
    EXPECT_LE(FormatProgressBar("prewarm", {.done = 5, .total = 10, .elapsed_s = 1}, width).size(),
              static_cast<size_t>(width));
  }
}

TEST(PrewarmProgressTest, LinesModePrintsTheFinalStateOnce) {
  std::ostringstream out;
  Progress progress(out, Progress::StyleFor(out), "prewarm", 3);  // not std::cerr: lines
  progress.Done(false);
  progress.Note("failed: something");
  progress.Done(true);
  progress.Done(false);
  progress.Finish();
  progress.Finish();
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("failed: something\n"));
  EXPECT_THAT(text, HasSubstr("prewarm: 3/3 (100%), 1 failed"));
  EXPECT_EQ(text.find("3/3"), text.rfind("3/3"));
  EXPECT_THAT(text, Not(HasSubstr("\r")));
}

}  // namespace
}  // namespace fusejit::tools
