// The manifest of `fusejit prewarm` (tools/manifest.h): lines, comments, grid expansion and its
// limit, canonical deduplication, and errors located as FILE:LINE:COLUMN in the original line.
// In-process, no NVRTC.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/manifest.h"

namespace fusejit::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<std::string> Specs(const Manifest& m) {
  std::vector<std::string> specs;
  for (const ManifestEntry& e : m.entries) specs.push_back(e.spec);
  return specs;
}

Manifest ParseOk(std::string_view text) {
  absl::StatusOr<Manifest> m = ParseManifest(text, "fleet.txt");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : Manifest{};
}

TEST(PrewarmManifestTest, ShapeGridExpandsToOneSpecPerValue) {
  Manifest m = ParseOk("x:f32[{1,8,32},3,16,32,32] | conv3d(out=16,k=3) | relu\n");
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,3,16,32,32] | conv3d(out=16,k=3) | relu",
                                    "x:f32[8,3,16,32,32] | conv3d(out=16,k=3) | relu",
                                    "x:f32[32,3,16,32,32] | conv3d(out=16,k=3) | relu"));
  EXPECT_EQ(m.specs, 3u);
  EXPECT_EQ(m.entries[2].location, "fleet.txt:1");
  EXPECT_TRUE(m.errors.empty());
}

TEST(PrewarmManifestTest, CommentsBlankLinesAndLineEndings) {
  Manifest m = ParseOk(
      "# the fleet\n"
      "\n"
      "   \t\n"
      "x:f32[1,3,8,8,8] | relu   # trailing comment { with a brace\r\n"
      "  # indented comment\n"
      "x:f32[2,3,8,8,8] | sigmoid");  // no final newline
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,3,8,8,8] | relu", "x:f32[2,3,8,8,8] | sigmoid"));
  EXPECT_EQ(m.entries[0].location, "fleet.txt:4");
  EXPECT_EQ(m.entries[1].location, "fleet.txt:6");
  EXPECT_EQ(m.specs, 2u);
}

TEST(PrewarmManifestTest, SeveralGridsAreACrossProductLeftmostSlowest) {
  Manifest m = ParseOk("x:f32[{1,2},3,8,8,8] | conv3d(out={4,8},k={1,[1,3,3]}) | {relu,gelu}\n");
  ASSERT_EQ(m.entries.size(), 16u);
  EXPECT_EQ(m.entries[0].spec, "x:f32[1,3,8,8,8] | conv3d(out=4,k=1) | relu");
  EXPECT_EQ(m.entries[1].spec, "x:f32[1,3,8,8,8] | conv3d(out=4,k=1) | gelu");
  EXPECT_EQ(m.entries[2].spec, "x:f32[1,3,8,8,8] | conv3d(out=4,k=[1,3,3]) | relu");
  EXPECT_EQ(m.entries[15].spec, "x:f32[2,3,8,8,8] | conv3d(out=8,k=[1,3,3]) | gelu");
}

TEST(PrewarmManifestTest, CanonicalDuplicatesAreKeptOnce) {
  Manifest m = ParseOk(
      "x:f32[1,3,8,8,8] | conv3d(out=8,k=3) | silu\n"
      "x:f32[1, 3, 8, 8, 8]|conv3d(k=[3,3,3], out=8, stride=1)|swish   # same chain\n"
      "x:f32[{1,1,2},3,8,8,8] | conv3d(out=8,k=3) | swish\n");
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,3,8,8,8] | conv3d(out=8,k=3) | swish",
                                    "x:f32[2,3,8,8,8] | conv3d(out=8,k=3) | swish"));
  EXPECT_EQ(m.specs, 5u);
  EXPECT_EQ(m.duplicates, 3u);
  EXPECT_EQ(m.entries[1].location, "fleet.txt:3");
}

TEST(PrewarmManifestTest, SpecErrorsAreLocatedInTheOriginalLine) {
  Manifest m = ParseOk(
      "x:f32[1,3,8,8,8] | relu\n"
      "x:f32[1,3,8,8,8] | rleu\n"
      //        1         2         3
      // 3456789012345678901234567890123
      "x:f32[{1,2},3,8,8,8] | conv3d(out=8,k=q) | relu\n");
  ASSERT_EQ(m.errors.size(), 3u);
  EXPECT_THAT(m.errors[0], StartsWith("fleet.txt:2:20: "));
  EXPECT_THAT(m.errors[0], HasSubstr("rleu"));
  // The column of 'q' in the line as written (the grid is 4 bytes longer than "1").
  EXPECT_THAT(m.errors[1], StartsWith("fleet.txt:3:39: "));
  EXPECT_THAT(m.errors[1], HasSubstr("(in \"x:f32[1,3,8,8,8] | conv3d(out=8,k=q) | relu\")"));
  EXPECT_THAT(m.errors[2], StartsWith("fleet.txt:3:39: "));
  EXPECT_THAT(m.errors[2], HasSubstr("(in \"x:f32[2,3,8,8,8]"));
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,3,8,8,8] | relu"));
  EXPECT_EQ(m.invalid_specs, 3u);
  EXPECT_EQ(m.specs, 4u);
}

TEST(PrewarmManifestTest, ValidationErrorsPointAtTheirOp) {
  // 12 channels are not divisible by 8 groups: only that value of the grid fails.
  Manifest m = ParseOk("x:f32[1,{8,12},4,4,4] | relu | group_norm(groups=8)\n");
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,8,4,4,4] | relu | group_norm(groups=8,eps=1e-5)"));
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_THAT(m.errors[0], StartsWith("fleet.txt:1:32: op 1 group_norm"));
  EXPECT_THAT(m.errors[0], HasSubstr("12 channels are not divisible by 8"));
  EXPECT_THAT(m.errors[0], HasSubstr("(in \"x:f32[1,12,4,4,4] | relu | group_norm(groups=8)\")"));
  // A chain-level error (no op): the spec's first column.
  m = ParseOk("   x:f32[1,3,8,8,8]\n");
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_THAT(m.errors[0], StartsWith("fleet.txt:1:4: the chain has no ops"));
}

TEST(PrewarmManifestTest, MalformedGridsAreLocated) {
  Manifest m = ParseOk(
      "x:f32[{1,2,3,8,8,8] | relu\n"      // never closed: at the '{'
      "x:f32[1}3,8,8,8] | relu\n"         // '}' alone
      "x:f32[{1,{2}},3,8,8,8] | relu\n"   // nested
      "x:f32[{},3,8,8,8] | relu\n"        // empty grid
      "x:f32[{ },3,8,8,8] | relu\n"       // empty grid too
      "x:f32[{1,,2},3,8,8,8] | relu\n"    // empty value
      "x:f32[{1,2,},3,8,8,8] | relu\n"    // trailing comma
      "x:f32[1,3,8,8,8] | relu\n");
  EXPECT_THAT(m.errors,
              ElementsAre(StartsWith("fleet.txt:1:7: grid '{' is not closed"),
                          StartsWith("fleet.txt:2:8: '}' without a matching '{'"),
                          StartsWith("fleet.txt:3:10: '{' inside the grid opened at column 7"),
                          StartsWith("fleet.txt:4:7: empty grid '{}'"),
                          StartsWith("fleet.txt:5:7: empty grid '{}'"),
                          StartsWith("fleet.txt:6:10: empty value in the grid opened at column 7"),
                          StartsWith("fleet.txt:7:12: empty value in the grid")));
  EXPECT_EQ(m.invalid_specs, 7u);
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,3,8,8,8] | relu"));
}

TEST(PrewarmManifestTest, ManyBadSpecsOfOneLineAreListedUpToFive) {
  Manifest m = ParseOk("x:f32[1,{3,5,6,7,9,10,11,13,16},4,4,4] | group_norm(groups=4)\n");
  EXPECT_THAT(Specs(m), ElementsAre("x:f32[1,16,4,4,4] | group_norm(groups=4,eps=1e-5)"));
  EXPECT_EQ(m.invalid_specs, 8u);
  ASSERT_EQ(m.errors.size(), 6u);
  EXPECT_EQ(m.errors[5], "fleet.txt:1: 3 more specs of this line have errors");
}

TEST(PrewarmManifestTest, ExpansionBeyondTheLimitRejectsTheManifest) {
  ManifestOptions options;
  options.max_specs = 10;
  absl::StatusOr<Manifest> m = ParseManifest(
      "x:f32[1,3,8,8,8] | relu\n"
      "x:f32[{1,2,3},3,8,8,{4,5,6,7}] | relu\n",
      "fleet.txt", options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              StartsWith("fleet.txt:2:7: this line expands to 12 specs (3 x 4); with the 1 specs "
                         "before it the manifest would exceed its limit of 10 specs"));
  // Products far beyond the limit do not overflow.
  std::string line = "x:f32[1,3,8,8,8]";
  for (int i = 0; i < 12; ++i) line += " | {relu,sigmoid,tanh,gelu,hardswish,swish,silu,relu}";
  m = ParseManifest(line, "big.txt");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              StartsWith("big.txt:1:20: this line expands to 68719476736 specs (8 x 8 x"));
  // Exactly at the limit is fine.
  m = ParseManifest("x:f32[{1,2},3,8,8,{4,5,6,7,8}] | relu\n", "fleet.txt", options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->entries.size(), 10u);
}

TEST(PrewarmManifestTest, ReadManifestNamesAMissingFile) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "no_such_manifest.txt").string();
  absl::StatusOr<Manifest> m = ReadManifest(path);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("cannot read manifest " + path + ": No such file or directory"));
}

TEST(PrewarmManifestTest, FileSizeLineLengthAndFileKindAreBounded) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "manifest_limits_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.txt").string();
  { std::ofstream(path) << "x:f32[1,4,4,4,4] | relu\n# " << std::string(100, 'c') << "\n"; }
  ManifestOptions options;
  options.max_bytes = 64;
  absl::StatusOr<Manifest> m = ReadManifest(path, options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("manifest " + path + " is 127 bytes; the limit for a manifest is 64 bytes"));
  options = ManifestOptions();
  options.max_line_bytes = 50;
  m = ReadManifest(path, options);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr(path + ":2:51: the line is 102 bytes long; the limit is 50 bytes per line"));
  EXPECT_TRUE(ReadManifest(path).ok());
  for (const std::string& special : {dir.string(), std::string("/dev/null")}) {
    m = ReadManifest(special);
    ASSERT_FALSE(m.ok()) << special;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << special;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("expected a regular file"));
  }
  std::filesystem::remove_all(dir);
}

TEST(PrewarmManifestTest, GridErrorsQuoteABoundedExcerpt) {
  std::string line = "x:f32[{1,2},4,4,4,4]";
  for (int i = 0; i < 25; ++i) line += " | sigmoid";
  line += " | rleu";
  absl::StatusOr<Manifest> m = ParseManifest(line, "long.txt");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->errors.size(), 2u);
  EXPECT_LT(m->errors[0].size(), 400u) << m->errors[0];
  EXPECT_THAT(m->errors[0], HasSubstr("unknown op 'rleu'"));
  EXPECT_THAT(m->errors[0], HasSubstr("| rleu\")"));
}

}  // namespace
}  // namespace fusejit::tools
