// Output-shape formulas against PyTorch's: the seed shapes from WORKLOADS.md, and hundreds of
// parameter combinations whose shapes (or refusals) PyTorch itself computed
// (tests/data/pytorch_conv_shapes.txt, written by bench/gen_shape_cases.py).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "fusejit/chain.h"
#include "fusejit/workloads.h"

namespace fusejit {
namespace {

TEST(Shapes, SeedChainsMatchWorkloadsTable) {
  const std::vector<Shape> conv_out = {{128, 16, 31, 63, 63},
                                       {1024, 16, 13, 29, 29},
                                       {16, 128, 34, 34, 34},
                                       {128, 24, 22, 30, 30}};
  const std::vector<Shape> out = {{128, 16, 31, 63, 63}, {1024, 16}, {16, 128, 34, 34, 34}, {128}};
  for (size_t i = 0; i < SeedWorkloads().size(); ++i) {
    absl::StatusOr<Chain> chain = ParseChain(SeedWorkloads()[i].spec);
    ASSERT_TRUE(chain.ok());
    EXPECT_EQ(ShapeAfter(*chain, 0), conv_out[i]) << SeedWorkloads()[i].id;
    EXPECT_EQ(OutputShape(*chain), out[i]) << SeedWorkloads()[i].id;
  }
}

TEST(Shapes, MatchPyTorchOnManyCombinations) {
  std::ifstream file(FUSEJIT_SOURCE_DIR "/tests/data/pytorch_conv_shapes.txt");
  ASSERT_TRUE(file) << "missing tests/data/pytorch_conv_shapes.txt";
  std::string line;
  int cases = 0, refused = 0;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind, arrow;
    int64_t f[21];
    in >> kind;
    for (int64_t& v : f) in >> v;
    in >> arrow;
    ASSERT_EQ(arrow, "->") << line;
    std::string first;
    in >> first;
    const Dims3 k{f[6], f[7], f[8]}, s{f[9], f[10], f[11]}, p{f[12], f[13], f[14]},
        d{f[15], f[16], f[17]}, op{f[18], f[19], f[20]};
    Chain chain;
    chain.input = {f[0], f[1], f[2], f[3], f[4]};
    chain.ops = {kind == "conv3d" ? Conv3d(f[5], k, s, p, d)
                                  : ConvTranspose3d(f[5], k, s, p, op, d)};
    const absl::Status status = ValidateChain(chain);
    ++cases;
    if (first == "error") {
      ++refused;
      EXPECT_FALSE(status.ok()) << "PyTorch refuses, fusejit accepts: " << line;
      continue;
    }
    ASSERT_TRUE(status.ok()) << line << ": " << status;
    int64_t dh, dw;
    in >> dh >> dw;
    const Shape expected = {f[0], f[5], std::stoll(first), dh, dw};
    EXPECT_EQ(OutputShape(chain), expected) << line;
  }
  EXPECT_GE(cases, 500);
  EXPECT_GT(refused, 0);  // the table exercises refusals too
  EXPECT_LT(refused, cases);
}

}  // namespace
}  // namespace fusejit
