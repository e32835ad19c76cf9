// tests/codegen/source_corpus_test.cc: the generated sources of a fixed corpus of chains stay what
// tests/data/generated_sources.txt records.
//
// For every chain of the corpus (the seeds, chains in the domain of each fast strategy, 40 random
// chains kept in tests/data/source_corpus_random_chains.txt, the seeds and hand-picked chains in
// bf16, f16 and f64), on sm_80 and sm_90, fp32 and tf32: the source every applicable strategy
// emits (its default configuration), and the backward plan's. Each line is
//   <arch> <precision> <strategy or "backward"> <hash of the source> <spec>
// A refactor of codegen must leave every line as it is (byte-identical sources, so identical
// kernels). A change that means to change sources rewrites the file with
//   FUSEJIT_UPDATE_SOURCE_HASHES=1 build/tests/unit_tests --gtest_filter='SourceCorpus.*'
// and the diff of the file says which chains and strategies it touched.
#include <gtest/gtest.h>

#include <cmath>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cache/cache_key.h"
#include "codegen/backward_plan.h"
#include "codegen/emit.h"
#include "codegen/op_table.h"
#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "fusejit/workloads.h"
#include "tests/random_chains.h"  // ParseOrFail

namespace fusejit {
namespace {

const char* kHashFile = FUSEJIT_SOURCE_DIR "/tests/data/generated_sources.txt";
// Random chains, drawn once and kept as text: RandomChain's draws depend on the compiler (the
// order in which it evaluates arguments), and the corpus must be the same under gcc and clang.
const char* kRandomChainsFile = FUSEJIT_SOURCE_DIR "/tests/data/source_corpus_random_chains.txt";

std::vector<std::string> CorpusSpecs() {
  std::vector<std::string> specs;
  for (const Workload& w : SeedWorkloads()) specs.push_back(w.spec);
  const std::vector<std::string> hand = {
      // conv-moments-mean / mma-moments-mean (few channels, mean)
      "x:f32[8,3,16,16,16] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])",
      "x:f32[4,3,12,16,16] | conv3d(out=24,k=3) | group_norm(groups=8) | mean(dims=[1,2,3,4])",
      "x:f32[2,8,10,10,10] | conv3d(out=32,k=3,padding=1,stride=2) | relu | group_norm(groups=4) | "
      "mean(dims=[2,3,4])",
      // transposed convolutions of few channels (convt-*)
      "x:f32[4,3,8,16,16] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | "
      "group_norm(groups=4) | hardswish",
      "x:f32[2,4,6,8,8] | conv_transpose3d(out=8,k=4,stride=2,padding=1,output_padding=1) | gelu | "
      "group_norm(groups=2)",
      // few output channels (direct-few-out)
      "x:f32[2,32,10,12,12] | conv3d(out=4,k=3,padding=1)",
      "x:f32[2,16,8,8,8] | conv3d(out=8,k=3) | tanh",
      // tensor-core engines (tc-conv, igemm-*)
      "x:f32[2,32,12,12,12] | conv3d(out=64,k=3,padding=1) | relu | group_norm(groups=8)",
      "x:f32[2,16,9,9,9] | conv_transpose3d(out=48,k=3,stride=2,padding=1) | gelu | "
      "group_norm(groups=4)",
      "x:f32[2,64,10,10,10] | conv3d(out=64,k=3,padding=1) | swish",
      "x:f32[1,64,12,12,12] | conv_transpose3d(out=128,k=3,bias=false) | relu | "
      "group_norm(groups=8)",
      "x:f32[2,32,8,10,12] | conv3d(out=128,k=3) | group_norm(groups=8) | mean(dims=[2,3,4])",
      "x:f32[2,64,9,11,13] | conv3d(out=256,k=3,padding=2,dilation=2) | swish | "
      "group_norm(groups=4) | tanh",
      "x:f32[3,20,7,9,11] | conv3d(out=37,k=2,stride=2,padding=1) | leaky_relu(negative_slope=0.2) | "
      "group_norm(groups=1) | mean(dims=[1,2,3,4])",
      // no convolution
      "x:f32[4,32,8,8,8] | group_norm(groups=8) | gelu",
      "x:f32[2,16,6,6,6] | swish | group_norm(groups=4) | mean(dims=[2,3,4])",
      "x:f32[3,5,7,9,11] | relu | clamp(min=-0.5,max=0.5) | mean(dims=[1,2,3,4])",
      "x:f32[3,5,7,9,11] | sigmoid | tanh",
  };
  specs.insert(specs.end(), hand.begin(), hand.end());
  std::ifstream random(kRandomChainsFile);
  EXPECT_TRUE(random.good()) << kRandomChainsFile;
  for (std::string l; std::getline(random, l);) {
    if (!l.empty() && l[0] != '#') specs.push_back(l);
  }
  // Other dtypes: the seeds and the hand-picked chains.
  const std::vector<std::string> f32 = specs;
  for (const char* d : {"bf16", "f16", "f64"}) {
    for (size_t i = 0; i < 4 + hand.size(); ++i) {
      std::string s = f32[i];
      s.replace(s.find("x:f32"), 5, absl::StrCat("x:", d));
      specs.push_back(s);
    }
  }
  return specs;
}

std::string Hash(const codegen::GeneratedSource& src) {
  return cache::HashSource(src.main, std::vector<std::string>{}).substr(0, 16);
}

// Calls f(arch, precision, strategy or "backward", canonical spec, emitted source) for every
// chain of the corpus on sm_80 and sm_90, fp32 and tf32: each applicable strategy's plan, then the
// backward plan (f32 chains).
template <class F>
void ForEachCorpusSource(F f) {
  for (const std::string& spec : CorpusSpecs()) {
    const Chain chain = ParseOrFail(spec);
    const std::string canonical = FormatChain(chain);
    for (const char* arch : {"sm_80", "sm_90"}) {
      for (Precision p : {Precision::kFp32, Precision::kTf32}) {
        const codegen::PlanTarget target{arch, 132, p};
        const char* prec = p == Precision::kFp32 ? "fp32" : "tf32";
        for (const auto& s : codegen::AllStrategies()) {
          if (!codegen::StrategyApplies(*s, chain, target)) continue;
          absl::StatusOr<codegen::Plan> plan = codegen::MakePlan(chain, target, s->name());
          EXPECT_TRUE(plan.ok()) << canonical << " " << s->name() << ": " << plan.status();
          if (!plan.ok()) continue;
          f(arch, prec, std::string(s->name()), canonical, *plan,
            codegen::EmitSource(chain, *plan));
        }
        if (chain.dtype != DType::kF32) continue;
        absl::StatusOr<codegen::Plan> back = codegen::PlanBackward(chain, target);
        if (back.ok())
          f(arch, prec, "backward", canonical, *back, codegen::EmitSource(chain, *back));
      }
    }
  }
}

std::vector<std::string> CorpusLines() {
  std::vector<std::string> lines;
  ForEachCorpusSource([&](const char* arch, const char* prec, const std::string& strategy,
                          const std::string& canonical, const codegen::Plan&,
                          const codegen::GeneratedSource& src) {
    lines.push_back(absl::StrCat(arch, " ", prec, " ", strategy, " ", Hash(src), " ", canonical));
  });
  return lines;
}

// The runtime launches generated kernels with programmatic dependent launch on sm_90
// (runtime/compiled_chain.cc): each may start before its predecessor has finished, so each must
// wait for it (fj::grid_dependency_begin) before anything else. Every kernel of every corpus plan.
TEST(SourceCorpus, EveryKernelWaitsForItsPredecessorFirst) {
  int kernels = 0;
  ForEachCorpusSource([&](const char* arch, const char* prec, const std::string& strategy,
                          const std::string& canonical, const codegen::Plan& plan,
                          const codegen::GeneratedSource& src) {
    for (const codegen::KernelLaunch& k : plan.kernels) {
      const size_t at = src.main.find(absl::StrCat(" ", k.symbol, "("));
      ASSERT_NE(at, std::string::npos) << k.symbol << " in " << canonical;
      const size_t body = src.main.find(") {\n", at);
      ASSERT_NE(body, std::string::npos) << k.symbol;
      EXPECT_EQ(src.main.compare(body, 34, ") {\n  fj::grid_dependency_begin();"), 0)
          << arch << " " << prec << " " << strategy << " " << k.symbol << " of " << canonical
          << " does not begin with fj::grid_dependency_begin()";
      ++kernels;
    }
  });
  EXPECT_GT(kernels, 1000);
}

TEST(SourceCorpus, GeneratedSourcesAreWhatTheHashFileRecords) {
  const std::vector<std::string> lines = CorpusLines();
  ASSERT_GT(lines.size(), 200u);
  if (const char* u = std::getenv("FUSEJIT_UPDATE_SOURCE_HASHES"); u && std::string(u) == "1") {
    std::ofstream out(kHashFile, std::ios::trunc);
    for (const std::string& l : lines) out << l << "\n";
    ASSERT_TRUE(out.good()) << "cannot write " << kHashFile;
    GTEST_SKIP() << "wrote " << lines.size() << " lines to " << kHashFile;
  }
  std::ifstream in(kHashFile);
  ASSERT_TRUE(in.good()) << kHashFile << " is missing; write it with FUSEJIT_UPDATE_SOURCE_HASHES=1";
  std::vector<std::string> want;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) want.push_back(l);
  }
  const std::set<std::string> have_set(lines.begin(), lines.end());
  const std::set<std::string> want_set(want.begin(), want.end());
  int added = 0, gone = 0;
  for (const std::string& l : lines) {
    if (!want_set.count(l) && added++ < 10) ADD_FAILURE() << "new or changed: " << l;
  }
  for (const std::string& l : want) {
    if (!have_set.count(l) && gone++ < 10) ADD_FAILURE() << "gone or changed: " << l;
  }
  EXPECT_EQ(lines, want) << "the generated sources changed; if that is meant, rewrite "
                         << kHashFile << " (FUSEJIT_UPDATE_SOURCE_HASHES=1) and say why";
}

// `chain` with every elementwise op replaced by `op`.
Chain WithElementwiseOps(Chain chain, const Op& op) {
  for (Op& o : chain.ops) {
    if (IsElementwise(o.kind)) o = op;
  }
  return chain;
}

// `src` (of a chain whose elementwise ops are all `op`) with `op`'s statements written as `as`'s,
// its name as `as`'s in the op lists of comments ("  // mul, mul"), and its chain's text as
// `as_chain`'s.
std::string Respelled(const std::string& src, const Chain& chain, const Op& op,
                      const Chain& as_chain, const Op& as) {
  const OpDesc &d = Describe(op.kind), &a = Describe(as.kind);
  std::string out;
  for (absl::string_view line : absl::StrSplit(src, '\n')) {
    std::string l(line);
    if (absl::StartsWith(l, "  // ")) {
      std::vector<std::string> names = absl::StrSplit(l.substr(5), ", ");
      for (std::string& n : names) {
        if (n == d.name) n = a.name;
      }
      l = absl::StrCat("  // ", absl::StrJoin(names, ", "));
    }
    absl::StrAppend(&out, l, "\n");
  }
  out.pop_back();  // the split's last piece had no newline
  return absl::StrReplaceAll(out, {{FormatChain(chain), FormatChain(as_chain)},
                                   {d.device(op, chain.dtype), a.device(as, chain.dtype)},
                                   {d.device_derivative(op), a.device_derivative(as)}});
}

// mul, add and the one-sided clamps reach the kernels only through their op-table statements
// (codegen/op_table.cc): for every corpus chain with elementwise ops, each strategy's plan and
// source (forward, training forward and backward) with every elementwise op mul(by=0.37),
// add(by=0.37), clamp(min=0.37) or clamp(max=0.37) is the plan and source with
// leaky_relu(slope=0.37) in their place -- a GPU-tested op -- but for those statements. (Written
// when they were new and no GPU was lent: mul/add have run on the GPU since, session 33.)
TEST(SourceCorpus, MulAndAddEmitAsAnyElementwiseOpButForTheirStatements) {
  const Op leaky = LeakyRelu(0.37);
  int compared = 0;
  for (const std::string& spec : CorpusSpecs()) {
    const Chain base = ParseOrFail(spec);
    if (std::none_of(base.ops.begin(), base.ops.end(),
                     [](const Op& o) { return IsElementwise(o.kind); })) {
      continue;
    }
    const Chain a = WithElementwiseOps(base, leaky);
    for (const Op& op : {Mul(0.37), Add(0.37), Clamp(0.37, HUGE_VAL), Clamp(-HUGE_VAL, 0.37)}) {
      const Chain b = WithElementwiseOps(base, op);
      for (const char* arch : {"sm_80", "sm_90"}) {
        const codegen::PlanTarget target{arch, 132, Precision::kFp32};
        SCOPED_TRACE(absl::StrCat(FormatChain(b), " ", arch));
        for (const auto& s : codegen::AllStrategies()) {
          const bool applies = codegen::StrategyApplies(*s, b, target);
          ASSERT_EQ(applies, codegen::StrategyApplies(*s, a, target)) << s->name();
          if (!applies) continue;
          absl::StatusOr<codegen::Plan> pa = codegen::MakePlan(a, target, s->name());
          absl::StatusOr<codegen::Plan> pb = codegen::MakePlan(b, target, s->name());
          ASSERT_TRUE(pa.ok() && pb.ok()) << s->name();
          EXPECT_EQ(Respelled(codegen::EmitSource(b, *pb).main, b, op, a, leaky),
                    codegen::EmitSource(a, *pa).main)
              << s->name();
          ++compared;
        }
        if (base.dtype != DType::kF32) continue;
        absl::StatusOr<codegen::Plan> ba = codegen::PlanBackward(a, target);
        absl::StatusOr<codegen::Plan> bb = codegen::PlanBackward(b, target);
        ASSERT_EQ(ba.ok(), bb.ok());
        if (!ba.ok()) continue;
        EXPECT_EQ(Respelled(codegen::EmitSource(b, *bb).main, b, op, a, leaky),
                  codegen::EmitSource(a, *ba).main)
            << "backward";
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 200);
}

}  // namespace
}  // namespace fusejit
