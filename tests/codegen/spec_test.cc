// Spec text: parse/print round trip, canonical form, and error messages for bad input.
#include <gtest/gtest.h>

#include "codegen/op_table.h"
#include "fusejit/chain.h"
#include "fusejit/workloads.h"
#include "tests/random_chains.h"

namespace fusejit {
namespace {

std::string Canonical(std::string_view spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_TRUE(chain.ok()) << spec << ": " << chain.status();
  return chain.ok() ? FormatChain(*chain) : "";
}

std::string ErrorOf(std::string_view spec) {
  absl::StatusOr<Chain> chain = ParseChain(spec);
  EXPECT_FALSE(chain.ok()) << spec << " parsed as " << (chain.ok() ? FormatChain(*chain) : "");
  return chain.ok() ? "" : std::string(chain.status().message());
}

TEST(Spec, CanonicalFormOfTheIssueExample) {
  EXPECT_EQ(Canonical("x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | "
                      "swish | group_norm(groups=4,eps=1e-5) | hardswish"),
            "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
            "group_norm(groups=4,eps=1e-5) | hardswish");
}

TEST(Spec, SpellingsOfOneChainPrintTheSame) {
  const std::string a = Canonical(
      "x : f32 [ 2,3,8,8,8 ]|conv3d( k=[3,3,3], out=4, stride=1, bias=true )|silu|"
      "group_norm(groups=2)|leaky_relu|mean(dims=[2,3,4])");
  const std::string b = Canonical(
      "x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | swish | group_norm(groups=2,eps=0.00001) | "
      "leaky_relu(slope=0.01) | mean(dims=[2,3,4])");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a,
            "x:f32[2,3,8,8,8] | conv3d(out=4,k=3) | swish | group_norm(groups=2,eps=1e-5) | "
            "leaky_relu(slope=0.01) | mean(dims=[2,3,4])");
  // PyTorch's argument names are aliases of the spec's.
  EXPECT_EQ(Canonical("x:f32[2,3,8,8,8] | conv3d(out_channels=4,kernel_size=3) | swish | "
                      "group_norm(num_groups=2) | leaky_relu(negative_slope=0.01) | "
                      "mean(dim=[2,3,4])"),
            a);
  EXPECT_EQ(Canonical("x:f32[2,3,8,8,8] | conv_transpose3d(out_channels=4,kernel_size=[3,1,3])"),
            "x:f32[2,3,8,8,8] | conv_transpose3d(out=4,k=[3,1,3])");
}

TEST(Spec, DTypesParsePrintAndDistinguishChains) {
  for (const char* dtype : {"f32", "f16", "bf16", "f64"}) {
    const std::string spec = std::string("x:") + dtype + "[2,3,8,8,8] | conv3d(out=4,k=3) | relu";
    EXPECT_EQ(Canonical(spec), spec);
  }
  absl::StatusOr<Chain> f32 = ParseChain("x:f32[2,3,8,8,8] | relu");
  absl::StatusOr<Chain> bf16 = ParseChain("x:bf16[2,3,8,8,8] | relu");
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  EXPECT_FALSE(*f32 == *bf16);  // so the dtype is part of every key made from the chain
  EXPECT_EQ(DTypeBytes(DType::kBF16), 2u);
  EXPECT_EQ(DTypeBytes(DType::kF64), 8u);
}

TEST(Spec, TuplesAndNonDefaultsArePrinted) {
  EXPECT_EQ(Canonical("x:f32[1,2,9,10,11] | conv_transpose3d(out=3,k=[1,3,5],stride=[1,2,3],"
                      "padding=[0,1,2],output_padding=[0,1,2],dilation=[1,1,1],bias=false) | "
                      "clamp(min=-0.5,max=2) | gelu"),
            "x:f32[1,2,9,10,11] | conv_transpose3d(out=3,k=[1,3,5],stride=[1,2,3],"
            "padding=[0,1,2],output_padding=[0,1,2],bias=false) | clamp(min=-0.5,max=2) | gelu");
}

TEST(Spec, SeedWorkloadsAreCanonical) {
  for (const Workload& w : SeedWorkloads()) EXPECT_EQ(Canonical(w.spec), w.spec) << w.id;
}

TEST(Spec, RandomChainsRoundTrip) {
  Rng rng(7);
  for (int i = 0; i < 300; ++i) {
    const Chain chain = RandomChain(rng);
    const std::string text = FormatChain(chain);
    absl::StatusOr<Chain> parsed = ParseChain(text);
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
    EXPECT_EQ(*parsed, chain) << text;
    EXPECT_EQ(FormatChain(*parsed), text);
  }
}

TEST(Spec, BuildersMatchParsing) {
  Chain built{{128, 3, 16, 32, 32},
              {ConvTranspose3d(16, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}), Elementwise(OpKind::kSwish),
               GroupNorm(4), Elementwise(OpKind::kHardswish)}};
  ASSERT_TRUE(ValidateChain(built).ok());
  EXPECT_EQ(FormatChain(built), SeedWorkloads()[0].spec);
}

TEST(Spec, ErrorsNameTheProblemAndTheFix) {
  {
    std::string e = ErrorOf("x:f32[2,16,8,8,8] | group_norm(groups=5)");
    EXPECT_NE(e.find("16 channels are not divisible by 5"), std::string::npos) << e;
    EXPECT_NE(e.find("group_norm"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,4,4,4] | conv3d(out=8,k=5)");
    EXPECT_NE(e.find("larger than the padded input"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,4,4,4] | conv_transpose3d(out=8,k=3,stride=2,output_padding=2)");
    EXPECT_NE(e.find("output_padding"), std::string::npos) << e;
    EXPECT_NE(e.find("smaller than either stride"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,0,4,4] | relu");
    EXPECT_NE(e.find(">= 1"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[100000,100000,10,10,10] | relu");
    EXPECT_NE(e.find("32-bit"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,8,8,8] | conv3d(out=4,k=3,stride=0)");
    EXPECT_NE(e.find("stride"), std::string::npos) << e;
    EXPECT_NE(e.find(">= 1"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,8,8,8] | conv3d(out=4,k=3,padding=-1)");
    EXPECT_NE(e.find("padding"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,8,8,8] | conv3d(out=4,k=3,output_padding=1)");
    EXPECT_NE(e.find("conv_transpose3d only"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,3,8,8,8] | relu | conv3d(out=4,k=3)");
    EXPECT_NE(e.find("first op"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | group_norm(groups=2) | group_norm(groups=2)");
    EXPECT_NE(e.find("at most one group_norm"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | mean(dims=[2,3,4]) | relu");
    EXPECT_NE(e.find("last op"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | mean(dims=[3,4])");
    EXPECT_NE(e.find("[2,3,4]"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | softmax");
    EXPECT_NE(e.find("unknown op 'softmax'"), std::string::npos) << e;
    EXPECT_NE(e.find("hardswish"), std::string::npos) << e;  // lists the valid ops
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=3,strde=2)");
    EXPECT_NE(e.find("unknown argument 'strde'"), std::string::npos) << e;
    EXPECT_NE(e.find("stride"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(k=3)");
    EXPECT_NE(e.find("missing required argument 'out'"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:i8[2,4,8,8,8] | relu");
    EXPECT_NE(e.find("'i8'"), std::string::npos) << e;
    EXPECT_NE(e.find("f32, f16, bf16 or f64"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8] | relu");
    EXPECT_NE(e.find("5-D"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] relu");
    EXPECT_NE(e.find("column 18"), std::string::npos) << e;
    EXPECT_NE(e.find("'|'"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | clamp(min=2,max=1)");
    EXPECT_NE(e.find("min <= max"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=2.5)");
    EXPECT_NE(e.find("whole number"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | group_norm(groups=2,eps=0)");
    EXPECT_NE(e.find("eps"), std::string::npos) << e;
  }
  {
    std::string e = ErrorOf("x:f32[2,4,8,8,8]");
    EXPECT_NE(e.find("no ops"), std::string::npos) << e;
  }
  {  // a positional value, as in Python's nn.LeakyReLU(0.2): name the op's arguments
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | leaky_relu(0.2)");
    EXPECT_NE(e.find("arguments are given by name"), std::string::npos) << e;
    EXPECT_NE(e.find("negative_slope"), std::string::npos) << e;
    e = ErrorOf("x:f32[2,4,8,8,8] | clamp(-1,1)");
    EXPECT_NE(e.find("arguments are given by name"), std::string::npos) << e;
    EXPECT_NE(e.find("min"), std::string::npos) << e;
    e = ErrorOf("x:f32[2,4,8,8,8] | relu(x)");
    EXPECT_NE(e.find("takes no arguments"), std::string::npos) << e;
  }
  {  // an unknown argument is named before a required one it may have been meant for
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,kernel=3)");
    EXPECT_NE(e.find("unknown argument 'kernel'"), std::string::npos) << e;
    EXPECT_NE(e.find("kernel_size"), std::string::npos) << e;
    e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=3,kernel_size=3)");
    EXPECT_NE(e.find("same argument"), std::string::npos) << e;
  }
  {  // a Python tuple where a per-dimension list is meant
    std::string e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=(3,1,3))");
    EXPECT_NE(e.find("k=[3,1,3]"), std::string::npos) << e;
  }
}

TEST(SpecHardening, IntegersAreParsedAsIntegersWithRangeChecks) {
  // Not [2,3,4] through a cast to int: refused before any narrowing.
  std::string e = ErrorOf("x:f32[2,4,8,8,8] | mean(dims=[4294967298,4294967299,4294967300])");
  EXPECT_NE(e.find("dims=4294967298 is out of range"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=3,padding=99999999999999999999)");
  EXPECT_NE(e.find("beyond 64-bit integers"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=3.0)");
  EXPECT_NE(e.find("k=3.0 must be a whole number"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=1e1)");
  EXPECT_NE(e.find("whole number"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8e0,8,8] | relu");
  EXPECT_NE(e.find("whole number"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=3,stride=nan)");
  EXPECT_NE(e.find("'nan'"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | mean(dims=[2,3,-4])");
  EXPECT_NE(e.find("dims=-4 is out of range"), std::string::npos) << e;
  EXPECT_EQ(Canonical("x:f32[+2,4,8,8,8] | conv3d(out=+4,k=3)"),
            "x:f32[2,4,8,8,8] | conv3d(out=4,k=3)");
}

TEST(SpecHardening, RealsMustBeFiniteAndRepresentableInTheChainsDType) {
  std::string e = ErrorOf("x:f32[2,4,8,8,8] | leaky_relu(slope=1e39)");
  EXPECT_NE(e.find("slope=1e39 is beyond the range of f32"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | group_norm(groups=2,eps=1e39)");
  EXPECT_NE(e.find("eps=1e39 is beyond the range of f32"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | group_norm(groups=2,eps=1e-46)");
  EXPECT_NE(e.find("eps=1e-46 rounds to 0 in f32"), std::string::npos) << e;
  e = ErrorOf("x:f16[2,4,8,8,8] | leaky_relu(slope=70000)");
  EXPECT_NE(e.find("beyond the range of f16 (largest magnitude 65504)"), std::string::npos) << e;
  e = ErrorOf("x:f16[2,4,8,8,8] | group_norm(groups=2,eps=1e-8)");
  EXPECT_NE(e.find("rounds to 0 in f16"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | clamp(min=-inf,max=1)");
  EXPECT_NE(e.find("must be a finite number"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | clamp(min=-1e400,max=1)");
  EXPECT_NE(e.find("too large to be represented"), std::string::npos) << e;
  e = ErrorOf("x:f64[2,4,8,8,8] | group_norm(groups=2,eps=1e-400)");
  EXPECT_NE(e.find("too small to be represented"), std::string::npos) << e;
  // Within each dtype's range: accepted (tiny non-zero slopes may round to 0: not invalid).
  EXPECT_EQ(Canonical("x:f64[2,4,8,8,8] | leaky_relu(slope=1e39)"),
            "x:f64[2,4,8,8,8] | leaky_relu(slope=1e39)");
  EXPECT_EQ(Canonical("x:f32[2,4,8,8,8] | group_norm(groups=2,eps=1e-45)"),
            "x:f32[2,4,8,8,8] | group_norm(groups=2,eps=1e-45)");
  EXPECT_EQ(Canonical("x:f32[2,4,8,8,8] | leaky_relu(slope=1e-50)"),
            "x:f32[2,4,8,8,8] | leaky_relu(slope=1e-50)");
  // The same checks for chains built in C++.
  Chain c{{2, 4, 8, 8, 8}, {LeakyRelu(3.5e38)}, DType::kF32};
  EXPECT_NE(std::string(ValidateChain(c).message()).find("beyond the range of f32"),
            std::string::npos);
  c.ops = {GroupNorm(2, 1e-300)};
  EXPECT_NE(std::string(ValidateChain(c).message()).find("rounds to 0 in f32"), std::string::npos);
}

TEST(SpecHardening, ConflictingAliasesAreRefused) {
  std::string e = ErrorOf("x:f32[2,4,8,8,8] | leaky_relu(slope=0.1,negative_slope=0.2)");
  EXPECT_NE(e.find("'slope' and 'negative_slope' are the same argument"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | mean(dims=[2,3,4],dim=[2,3,4])");
  EXPECT_NE(e.find("'dims' and 'dim' are the same argument"), std::string::npos) << e;
  EXPECT_EQ(Canonical("x:f32[2,4,8,8,8] | leaky_relu(negative_slope=0.2)"),
            "x:f32[2,4,8,8,8] | leaky_relu(slope=0.2)");
}

TEST(SpecHardening, LimitsAreNamedAndOutputSizesNeverOverflow) {
  std::string e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=3,padding=4611686018427387904)");
  EXPECT_NE(e.find("padding (d) is 4611686018427387904; the limit is 1024"), std::string::npos)
      << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | conv_transpose3d(out=4,k=3,dilation=9223372036854775807)");
  EXPECT_NE(e.find("the limit is 64"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,8] | conv3d(out=4,k=33)");
  EXPECT_NE(e.find("k (d) is 33; the limit is 32"), std::string::npos) << e;
  e = ErrorOf("x:f32[2,4,8,8,2000000] | relu");
  EXPECT_NE(e.find("over the limit of 1048576"), std::string::npos) << e;
  e = ErrorOf("x:f32[1,1,1,1,20000] | conv_transpose3d(out=1,k=32,stride=64)");
  EXPECT_NE(e.find("output size along w is 1279968; the limit is 1048576"), std::string::npos)
      << e;
  // C++ chains with values no parser would produce: errors, never signed overflow (UBSan).
  Chain c{{2, 4, 8, 8, 8}, {ConvTranspose3d(4, {3, 3, 3}, {1, 1, 1}, {INT64_MAX, 0, 0})},
          DType::kF32};
  EXPECT_NE(std::string(ValidateChain(c).message()).find("the limit is 1024"), std::string::npos);
  c.ops = {Conv3d(4, {3, 3, 3}, {1, 1, 1}, {0, 0, 0}, {INT64_MIN, 1, 1})};
  EXPECT_NE(std::string(ValidateChain(c).message()).find("dilation must be >= 1"),
            std::string::npos);
  // Total work of one kernel, and the reduction behind one output.
  e = ErrorOf("x:f32[1,512,128,128,128] | conv3d(out=64,k=7,padding=3)");
  EXPECT_NE(e.find("multiply-adds"), std::string::npos) << e;
  EXPECT_NE(e.find("the limit for one kernel is 17592186044416"), std::string::npos) << e;
  e = ErrorOf("x:f32[1,4096,32,32,32] | conv3d(out=4,k=32)");
  EXPECT_NE(e.find("the limit is 1048576"), std::string::npos) << e;
  // Ops and spec length.
  std::string many = "x:f32[1,4,4,4,4]";
  for (size_t i = 0; i < ChainLimits::kMaxOps; ++i) many += " | relu";
  EXPECT_TRUE(ParseChain(many).ok());
  e = ErrorOf(many + " | relu");
  EXPECT_NE(e.find("the limit is 32 ops"), std::string::npos) << e;
  std::string long_spec = "x:f32[1,4,4,4,4] | relu" + std::string(5000, ' ');
  e = ErrorOf(long_spec);
  EXPECT_NE(e.find("the spec is 5023 bytes long; the limit is 4096 bytes"), std::string::npos);
}

TEST(SpecHardening, ErrorsQuoteABoundedExcerptAndNameNonAsciiCharacters) {
  std::string spec = "x:f32[1,4,4,4,4]";
  for (int i = 0; i < 30; ++i) spec += " | sigmoid";
  spec += " | rleu";
  std::string e = ErrorOf(spec);
  EXPECT_LT(e.size(), 180u + OpNamesText().size()) << e;  // the excerpt bounded, and the op list
  EXPECT_NE(e.find("unknown op 'rleu'"), std::string::npos) << e;
  EXPECT_NE(e.find("(in \"...oid | sigmoid"), std::string::npos) << e;  // cut, marked
  EXPECT_NE(e.find("| sigmoid | rleu\")"), std::string::npos) << e;
  e = ErrorOf("x:f32[1,4,4,4,4] \u2013 relu");  // an en dash for '|'
  EXPECT_NE(e.find("U+2013 (UTF-8 e2 80 93, looks like '-'"), std::string::npos) << e;
  e = ErrorOf("x:f32[1,4,4,4,4] | conv3d(out=4,k=\uff13)");  // fullwidth 3
  EXPECT_NE(e.find("U+FF13 (UTF-8 ef bc 93, looks like '3'"), std::string::npos) << e;
  e = ErrorOf("x:f32[1,4,4,4,4] |\u00a0relu");  // a no-break space
  EXPECT_NE(e.find("U+00A0"), std::string::npos) << e;
  e = ErrorOf("x:f32[1,4,4,4,4] | \xff");
  EXPECT_NE(e.find("byte 0xff (not UTF-8)"), std::string::npos) << e;
  EXPECT_EQ(e.find("''"), std::string::npos) << e;  // never an empty quote
  // A long run of stray UTF-8 continuation bytes (found by the spec fuzzer): the excerpt stays
  // bounded (each byte is escaped as \x8e, four characters).
  e = ErrorOf("x:f32[1,4,4,4,4]\x80 r" + std::string(600, '\x8e'));
  EXPECT_LT(e.size(), 600u) << e.size();
  EXPECT_NE(e.find("byte 0x80 (not UTF-8)"), std::string::npos) << e;
}

TEST(Spec, ParamsAreNamedLikeNnSequential) {
  absl::StatusOr<Chain> chain = ParseChain(SeedWorkloads()[0].spec);
  ASSERT_TRUE(chain.ok());
  const std::vector<ParamSpec> params = ChainParams(*chain);
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].name, "0.weight");
  EXPECT_EQ(params[0].shape, (Shape{3, 16, 3, 3, 3}));  // ConvTranspose3d: [Cin, Cout, k...]
  EXPECT_EQ(params[1].name, "0.bias");
  EXPECT_EQ(params[1].shape, (Shape{16}));
  EXPECT_EQ(params[2].name, "2.weight");
  EXPECT_EQ(params[3].name, "2.bias");
  absl::StatusOr<Chain> w3 = ParseChain(SeedWorkloads()[2].spec);
  ASSERT_TRUE(w3.ok());
  const std::vector<ParamSpec> p3 = ChainParams(*w3);
  ASSERT_EQ(p3.size(), 3u);  // bias=false: no 0.bias
  EXPECT_EQ(p3[0].shape, (Shape{64, 128, 3, 3, 3}));
  EXPECT_EQ(p3[1].name, "2.weight");
  absl::StatusOr<Chain> w2 = ParseChain(SeedWorkloads()[1].spec);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(ChainParams(*w2)[0].shape, (Shape{16, 3, 4, 4, 4}));  // Conv3d: [Cout, Cin, k...]
}

}  // namespace
}  // namespace fusejit
