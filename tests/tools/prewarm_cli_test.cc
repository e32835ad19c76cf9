// `fusejit prewarm` end to end: the built CLI (FUSEJIT_CLI_PATH) run as subprocesses with their
// own HOME, TMPDIR and cache directory. Prewarm for two architectures, then fresh processes find
// every entry cached; a bad spec and an architecture NVRTC rejects fail alone; two prewarms race
// on one cache; --verify reports corrupt and evicted entries; the second run compiles nothing;
// --device plans and tunes for a GPU this machine lacks.
// Small chains, so that NVRTC takes well under a second each. No GPU needed.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/planner.h"
#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jit/driver.h"
#include "tune/tuning_db.h"

#ifndef FUSEJIT_CLI_PATH
#error "FUSEJIT_CLI_PATH must name the built fusejit binary (tests/CMakeLists.txt defines it)"
#endif

namespace fusejit {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// Three small chains (six pairs for two architectures).
constexpr char kManifest[] =
    "# a small fleet\n"
    "x:f32[{1,2},4,4,4,4] | relu      # two batch sizes\n"
    "\n"
    "x:f32[1,4,4,4,4] | sigmoid | tanh\n"
    "x:f32[1,4, 4,4,4] | relu         # a duplicate of the first\n";
const std::vector<std::string> kSpecs = {"x:f32[1,4,4,4,4] | relu", "x:f32[2,4,4,4,4] | relu",
                                         "x:f32[1,4,4,4,4] | sigmoid | tanh"};

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// The number after `label` in a summary line such as "  compiled        6".
int Count(const std::string& out, const std::string& label) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("\\n  " + label + " +([0-9]+)"))) return -1;
  return std::stoi(m[1]);
}

std::vector<fs::path> Entries(const fs::path& dir) {
  std::vector<fs::path> entries;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".fjk") entries.push_back(e.path());
  }
  return entries;
}

class PrewarmCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("fusejit_prewarm_") + info->name() + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "home");
    fs::create_directories(dir_ / "tmp");
    cache_ = dir_ / "cache";
    manifest_ = dir_ / "fleet.txt";
    WriteFile(manifest_, kManifest);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Starts the fusejit binary with `args`; HOME, TMPDIR and FUSEJIT_CACHE_DIR inside this test's
  // folder, plus `extra_env` ("NAME=value"). Output goes to files named after `tag`.
  pid_t Start(const std::vector<std::string>& args, const std::string& tag,
              const std::vector<std::string>& extra_env = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var = *e;
      const std::string name = var.substr(0, var.find('='));
      if (name == "HOME" || name == "XDG_CACHE_HOME" || name == "TMPDIR" ||
          name.rfind("FUSEJIT_", 0) == 0) {
        continue;
      }
      env.push_back(var);
    }
    env.push_back("HOME=" + (dir_ / "home").string());
    env.push_back("TMPDIR=" + (dir_ / "tmp").string());
    env.push_back("FUSEJIT_CACHE_DIR=" + cache_.string());
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::vector<std::string> argv_s = {FUSEJIT_CLI_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv, envp;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const fs::path out_path = dir_ / (tag + ".out"), err_path = dir_ / (tag + ".err");
    const pid_t pid = fork();
    if (pid == 0) {
      const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
    return pid;
  }

  Result Wait(pid_t pid, const std::string& tag) {
    Result r;
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
      ADD_FAILURE() << "could not run " << FUSEJIT_CLI_PATH << ": " << std::strerror(errno);
      return r;
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadFile(dir_ / (tag + ".out"));
    r.err = ReadFile(dir_ / (tag + ".err"));
    return r;
  }

  Result Run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    return Wait(Start(args, "run", env), "run");
  }

  // `fusejit prewarm` of this test's manifest into this test's cache, plus `flags`.
  Result Prewarm(const std::vector<std::string>& flags, const std::vector<std::string>& env = {}) {
    std::vector<std::string> args = {"prewarm", manifest_.string(), "--cache-dir", cache_.string()};
    args.insert(args.end(), flags.begin(), flags.end());
    return Run(args, env);
  }

  fs::path dir_, cache_, manifest_;
};

TEST_F(PrewarmCliTest, TwoArchitecturesThenFreshProcessesFindEveryEntryCached) {
  Result r = Prewarm({"--arch", "sm_80,sm_90", "--jobs", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 specs (1 duplicate) -> 3 chains x 2 architectures "
                               "(sm_80, sm_90) = 6 pairs on 2 workers"));
  EXPECT_EQ(Count(r.out, "compiled"), 6) << r.out;
  EXPECT_EQ(Count(r.out, "already cached"), 0) << r.out;
  EXPECT_EQ(Count(r.out, "failed"), 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("chains/s"));
  EXPECT_THAT(r.out, HasSubstr("compile time    mean"));
  EXPECT_THAT(r.err, HasSubstr("prewarm: 6/6 (100%)"));  // plain progress lines: not a terminal
  EXPECT_EQ(Entries(cache_).size(), 6u);

  // Fresh processes, as a later run would ask: every pair is a disk hit.
  for (const std::string& spec : kSpecs) {
    for (const std::string arch : {"sm_80", "sm_90"}) {
      Result c = Run({"compile", spec, "--arch", arch});
      EXPECT_EQ(c.exit_code, 0) << c.err;
      EXPECT_THAT(c.out, HasSubstr("cache:     hit")) << spec << " " << arch << "\n" << c.out;
    }
  }
  // Idempotent: the second prewarm compiles nothing.
  r = Prewarm({"--arch", "sm_90,sm_80"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(Count(r.out, "compiled"), 0) << r.out;
  EXPECT_EQ(Count(r.out, "already cached"), 6) << r.out;
  EXPECT_THAT(r.out, HasSubstr("0 entries written"));
  EXPECT_EQ(Entries(cache_).size(), 6u);
}

TEST_F(PrewarmCliTest, BadSpecsFailAloneAndExitTwoRejectedArchitecturesCompileNothing) {
  WriteFile(manifest_,
            "x:f32[1,4,4,4,4] | relu\n"
            "x:f32[1,{4,6},4,4,4] | group_norm(groups=4)   # 6 channels: not divisible\n"
            "x:f32[1,4,4,4,4] | tanh\n");
  // sm_10: a well-formed name that NVRTC does not support: refused up front, like a bad spec
  // (exit 2), before anything is compiled.
  Result r = Prewarm({"--arch", "sm_90,sm_10", "--jobs", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--arch: sm_10 is not supported by NVRTC"));
  EXPECT_THAT(r.err, HasSubstr("sm_90"));  // the supported ones are listed
  EXPECT_FALSE(fs::exists(cache_));
  // The valid specs are compiled; the invalid one is input error: exit 2 at the end.
  r = Prewarm({"--arch", "sm_90", "--jobs", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(Count(r.out, "compiled"), 3) << r.out;  // every valid pair
  EXPECT_THAT(r.out, HasSubstr("(1 invalid in the manifest"));
  EXPECT_THAT(r.out, HasSubstr(manifest_.string() +
                               ":2:24: op 0 group_norm(groups=4,eps=1e-5): 6 channels are not "
                               "divisible by 4 groups"));
  EXPECT_THAT(r.err, HasSubstr("fusejit prewarm: error: 1 invalid specs"));
  EXPECT_EQ(Entries(cache_).size(), 3u);
}

TEST_F(PrewarmCliTest, WithoutArchItIsTheDeviceOrSm90) {
  WriteFile(manifest_, "x:f32[1,4,4,4,4] | relu\n");
  Result r = Prewarm({});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  if (!jit::Driver().ok()) {
    EXPECT_THAT(r.err, HasSubstr("note: compiling for sm_90 (give --arch sm_XX to choose)"));
    EXPECT_THAT(r.out, HasSubstr("1 chains x 1 architecture (sm_90) = 1 pairs"));
  }
  EXPECT_EQ(Count(r.out, "compiled"), 1) << r.out;
}

TEST_F(PrewarmCliTest, TwoPrewarmsRacingOnOneCacheBothSucceedAndCompileEachPairOnce) {
  WriteFile(manifest_, "x:f32[{1,2,3,4},4,4,4,4] | relu\n");
  const std::vector<std::string> args = {"prewarm", manifest_.string(), "--arch", "sm_90",
                                         "--jobs", "2", "--cache-dir", cache_.string()};
  const pid_t a = Start(args, "a");
  const pid_t b = Start(args, "b");
  Result ra = Wait(a, "a"), rb = Wait(b, "b");
  ASSERT_EQ(ra.exit_code, 0) << ra.out << ra.err;
  ASSERT_EQ(rb.exit_code, 0) << rb.out << rb.err;
  // Each key is compiled by one process (the cache's per-key lock); the other reads it.
  EXPECT_EQ(Count(ra.out, "compiled") + Count(rb.out, "compiled"), 4) << ra.out << rb.out;
  EXPECT_EQ(Count(ra.out, "already cached") + Count(rb.out, "already cached"), 4);
  Result v = Run({"cache", "verify", "--cache-dir", cache_.string()});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr("checked 4 entries: 4 ok, 0 bad"));
  Result again = Wait(Start(args, "c"), "c");
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_EQ(Count(again.out, "compiled"), 0) << again.out;
}

TEST_F(PrewarmCliTest, VerifyReportsACorruptEntryAndPassesOnceItIsReplaced) {
  WriteFile(manifest_, "x:f32[{1,2},4,4,4,4] | relu\n");
  Result r = Prewarm({"--arch", "sm_90", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("entries         2 checked, 2 ok"));
  if (!jit::Driver().ok()) EXPECT_THAT(r.out, HasSubstr("modules         not loaded (no GPU)"));

  std::vector<fs::path> entries = Entries(cache_);
  ASSERT_EQ(entries.size(), 2u);
  std::string bytes = ReadFile(entries[0]);
  bytes[bytes.size() / 2] ^= 0x10;
  WriteFile(entries[0], bytes);
  r = Prewarm({"--arch", "sm_90", "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 invalid cache entries were found (and replaced)"));
  EXPECT_EQ(Count(r.out, "compiled"), 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr(entries[0].filename().string()));  // the cache's warning
  // Replaced: the next verify is clean.
  r = Prewarm({"--arch", "sm_90", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(Count(r.out, "already cached"), 2) << r.out;
}

TEST_F(PrewarmCliTest, KernelsTheCacheCannotKeepAreProblems) {
  WriteFile(manifest_, "x:f32[{1,2},4,4,4,4] | relu\n");
  // A 1-byte limit: no entry fits, nothing is stored.
  Result r = Prewarm({"--arch", "sm_90"}, {"FUSEJIT_CACHE_MAX_BYTES=1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(Count(r.out, "compiled"), 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("2 compiled kernels could not be stored in the cache"));
  EXPECT_THAT(r.err, HasSubstr("exceeds the cache limit"));  // the cache's warning

  // Room for one entry: the second publish evicts the first; --verify finds it missing.
  r = Prewarm({"--arch", "sm_90"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  uintmax_t largest = 0;
  for (const fs::path& e : Entries(cache_)) largest = std::max(largest, fs::file_size(e));
  cache_ = dir_ / "small_cache";
  r = Prewarm({"--arch", "sm_90", "--jobs", "1", "--verify"},
              {"FUSEJIT_CACHE_MAX_BYTES=" + std::to_string(largest * 3 / 2)});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("entries         2 checked, 1 ok"));
  EXPECT_THAT(r.out, HasSubstr("is missing (evicted to stay under the size limit"));
  EXPECT_THAT(r.out, HasSubstr("1 entries were evicted"));
  EXPECT_THAT(r.out, HasSubstr("raise FUSEJIT_CACHE_MAX_BYTES"));
}

TEST_F(PrewarmCliTest, DevicePlansAndTunesAsARunOnThatGpu) {
  // A tuning record for a GPU this machine lacks, stored beside the cache as autotune would.
  const char* const spec =
      "x:f32[4,3,8,16,16] | conv3d(out=16,k=3) | hardswish | group_norm(groups=4) | "
      "mean(dims=[2,3,4])";
  const Chain chain = *ParseChain(spec);
  const codegen::PlanTarget target{"sm_90", 132, Precision::kFp32};
  const DeviceKey device{"Test GPU (fusejit tests)", 132, 13000};
  const codegen::TuneConfig standard = *codegen::DefaultTuneConfig(chain, target);
  codegen::TuneConfig tuned;
  for (const codegen::TuneConfig& c : codegen::AllCandidates(chain, target)) {
    if (c.strategy == standard.strategy && c.Distance(standard) == 1) {
      tuned = c;
      break;
    }
  }
  ASSERT_FALSE(tuned.strategy.empty());
  fs::create_directories(cache_);
  fs::permissions(cache_, fs::perms::owner_all);
  tune::TuningDbOptions db_options;
  db_options.dir = (cache_ / "tuning").string();
  tune::TuningDb db(db_options);
  tune::TuningRecord record;
  record.key = {FormatChain(chain), "sm_90", Precision::kFp32, device};
  record.fusejit_version = GeneratorBuild();
  record.config = tuned.ToString();
  record.default_config = standard.ToString();
  record.tuned_at = "2026-11-22T10:00:00Z";
  ASSERT_TRUE(db.Store(record).ok());
  WriteFile(manifest_, std::string(spec) + "\n");

  Result r = Prewarm({"--arch", "sm_90", "--device", "Test GPU (fusejit tests), 132, 13000"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("device:  Test GPU (fusejit tests) (132 SMs, driver 13000)"));
  EXPECT_EQ(Count(r.out, "compiled"), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("configurations  1 tuned"));
  // Without the device: the default configuration, another entry.
  r = Prewarm({"--arch", "sm_90"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(Count(r.out, "compiled"), 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("configurations  1 default"));
  r = Prewarm({"--arch", "sm_90", "--device", "Test GPU (fusejit tests),132,13000"});
  EXPECT_EQ(Count(r.out, "already cached"), 1) << r.out;

  for (const char* bad : {"Test GPU", "Test GPU,132", ",132,13000", "Test GPU,x,13000"}) {
    r = Prewarm({"--arch", "sm_90", "--device", bad});
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.err, HasSubstr("is not NAME,SMS,DRIVER")) << bad;
  }
  r = Prewarm({"--arch", "sm_80,sm_90", "--device", "Test GPU,132,13000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--device needs exactly one --arch"));
}

TEST_F(PrewarmCliTest, UsageAndSetupErrors) {
  Result r = Run({"prewarm"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing argument MANIFEST"));
  r = Run({"prewarm", manifest_.string(), "--arch", "sm_90,,sm_80"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--arch: empty architecture"));
  r = Run({"prewarm", manifest_.string(), "--arch", "90"});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({"prewarm", manifest_.string(), "--jobs", "0"});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({"prewarm", (dir_ / "missing.txt").string(), "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2);  // a missing input file is invalid input
  EXPECT_THAT(r.err, HasSubstr("cannot read manifest"));
  r = Run({"prewarm", "/dev/zero", "--arch", "sm_90"});  // not read: no unbounded memory
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("manifest /dev/zero is a character device; expected a regular file"));
  r = Run({"prewarm", dir_.string(), "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("is a directory; expected a regular file"));
  r = Run({"prewarm", manifest_.string(), "--arch", ""});
  EXPECT_EQ(r.exit_code, 2);
  r = Run({"prewarm", manifest_.string(), "--arch", "sm_10"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("not supported by NVRTC"));
  r = Run({"prewarm", manifest_.string(), "--arch", "sm_90"}, {"FUSEJIT_DISABLE_CACHE=1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the kernel cache is not usable"));
  WriteFile(manifest_, "# nothing\n\n");
  r = Run({"prewarm", manifest_.string(), "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("names no specs"));
  std::string big = "x:f32[1,4,4,4,4]";
  for (int i = 0; i < 6; ++i) big += " | {relu,sigmoid,tanh,gelu,hardswish,swish,silu}";
  WriteFile(manifest_, "\n" + big + "\n");
  r = Run({"prewarm", manifest_.string(), "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(manifest_.string() +
                               ":2:20: this line expands to 117649 specs (7 x 7 x 7 x 7 x 7 "
                               "x 7); with the 0 specs before it the manifest would exceed its "
                               "limit of 100000 specs"));
  WriteFile(manifest_, "x:f32[{1,2},4,4,4,4] | relu\nx:f32[1,4,4,4,4] | rleu\n");
  cache_ = dir_ / "untouched_cache";
  r = Run({"prewarm", manifest_.string(), "--list"});  // compiles nothing, touches no cache
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "x:f32[1,4,4,4,4] | relu\nx:f32[2,4,4,4,4] | relu\n# " + manifest_.string() +
                       ": 3 specs, 2 chains, 0 duplicates, 1 invalid\n");
  EXPECT_THAT(r.err, HasSubstr(manifest_.string() + ":2:20: "));
  EXPECT_FALSE(fs::exists(cache_));
  r = Run({"prewarm", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag :
       {"--arch", "--jobs", "--cache-dir", "--verify", "--precision", "--list"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  r = Run({"--help"});
  EXPECT_THAT(r.out, HasSubstr("  prewarm "));
}

}  // namespace
}  // namespace fusejit
