// Tests of the `fusejit` CLI: the argument parser in-process, and the built binary
// (FUSEJIT_CLI_PATH) as a subprocess with its own HOME and kernel cache directory. All run without
// a GPU; the few whose behavior differs on a machine with a driver skip there.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fusejit/chain.h"
#include "fusejit/fusejit.h"
#include "fusejit/reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jit/driver.h"
#include "reference/npy.h"
#include "tools/args.h"
#include "tools/common.h"
#include "tools/runner.h"

#ifndef FUSEJIT_CLI_PATH
#error "FUSEJIT_CLI_PATH must name the built fusejit binary (tools/CMakeLists.txt defines it)"
#endif

namespace fusejit::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// ---------------------------------------------------------------------------------------------
// The argument parser.

CommandSpec TestSpec() {
  return CommandSpec{
      .name = "fusejit test",
      .positional = "SPEC",
      .min_positional = 1,
      .max_positional = 1,
      .summary = "a test command",
      .flags = {{"input", "FILE", "the input"},
                {"param", "NAME=FILE", "a parameter", /*repeated=*/true},
                {"check", "", "a switch"}},
  };
}

TEST(CliArgsTest, ValuesBothFormsAndPositional) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--input", "a.npy", "SPEC", "--check"}, TestSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Get("input"), "a.npy");
  EXPECT_TRUE(p->Has("check"));
  EXPECT_FALSE(p->Has("param"));
  EXPECT_EQ(p->positional, std::vector<std::string>{"SPEC"});

  p = ParseArgs({"--input=b=c.npy", "SPEC"}, TestSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Get("input"), "b=c.npy");  // only the first '=' separates
  p = ParseArgs({"--input=", "SPEC"}, TestSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Get("input"), "");
}

TEST(CliArgsTest, RepeatedFlagKeepsEveryValueInOrder) {
  absl::StatusOr<ParsedArgs> p = ParseArgs(
      {"--param", "0.weight=w.npy", "SPEC", "--param=0.bias=b.npy", "--param", "2.weight=g.npy"},
      TestSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->GetAll("param"),
            (std::vector<std::string>{"0.weight=w.npy", "0.bias=b.npy", "2.weight=g.npy"}));
  EXPECT_TRUE(p->GetAll("input").empty());
}

TEST(CliArgsTest, NonRepeatedFlagTwiceIsRefused) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--input", "a", "--input=b", "SPEC"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("--input is given more than once"));
}

TEST(CliArgsTest, UnknownFlagIsNamedAndValidOnesListed) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"SPEC", "--inptu", "x.npy"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "unknown flag --inptu for 'fusejit test'; valid flags: --input, --param, --check, "
            "--help");
  p = ParseArgs({"SPEC", "--bogus=3"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("unknown flag --bogus "));
}

TEST(CliArgsTest, MissingValueIsRefused) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"SPEC", "--input"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "--input needs a value (--input FILE)");
  // A flag where the value should be is taken as a forgotten value, not as a file name.
  p = ParseArgs({"SPEC", "--input", "--check"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("--input needs a value"));
}

TEST(CliArgsTest, SwitchRefusesAValue) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"SPEC", "--check=yes"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("--check is a switch"));
}

TEST(CliArgsTest, PositionalCountIsChecked) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "missing argument SPEC");
  p = ParseArgs({"x:f32[1,1,1,1,1]", "|", "relu"}, TestSpec());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("unexpected extra argument '|'"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("quote the spec"));
}

TEST(CliArgsTest, HelpNeedsNothingElse) {
  for (const char* help : {"--help", "-h"}) {
    absl::StatusOr<ParsedArgs> p = ParseArgs({help}, TestSpec());
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(p->help);
  }
}

TEST(CliArgsTest, DoubleDashEndsFlagsAndSingleDashIsPositional) {
  absl::StatusOr<ParsedArgs> p = ParseArgs({"--", "--check"}, TestSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->positional, std::vector<std::string>{"--check"});
  EXPECT_FALSE(p->Has("check"));
  p = ParseArgs({"-"}, TestSpec());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->positional, std::vector<std::string>{"-"});
}

TEST(CliArgsTest, HelpTextListsEveryFlag) {
  const std::string help = FormatHelp(TestSpec());
  EXPECT_THAT(help, HasSubstr("usage: fusejit test SPEC [flags]"));
  EXPECT_THAT(help, HasSubstr("--input FILE"));
  EXPECT_THAT(help, HasSubstr("--param NAME=FILE"));
  EXPECT_THAT(help, HasSubstr("(repeatable)"));
  EXPECT_THAT(help, HasSubstr("--check "));
  EXPECT_THAT(help, HasSubstr("--help"));
}

TEST(CliArgsTest, TypedValues) {
  EXPECT_EQ(*ParseIntFlag("reps", "12", 0, 100), 12);
  EXPECT_EQ(ParseIntFlag("reps", "1x", 0, 100).status().message(),
            "--reps: '1x' is not an integer");
  EXPECT_EQ(ParseIntFlag("reps", "-1", 0, 100).status().message(),
            "--reps: -1 is out of range [0, 100]");
  EXPECT_DOUBLE_EQ(*ParseDoubleFlag("rtol", "1e-6"), 1e-6);
  EXPECT_FALSE(ParseDoubleFlag("rtol", "nan").ok());
  EXPECT_FALSE(ParseDoubleFlag("rtol", "-1").ok());
}

TEST(CliArgsTest, ArchNames) {
  for (const char* ok : {"sm_80", "sm_90", "sm_90a", "sm_100", "sm_120a"}) {
    EXPECT_TRUE(ValidateArch(ok).ok()) << ok;
  }
  for (const char* bad : {"", "sm90", "sm_", "sm_9", "sm_90A", "sm_90ab", "compute_90", "sm_x0"}) {
    EXPECT_FALSE(ValidateArch(bad).ok()) << bad;
  }
}

TEST(CliRunnerTest, SpreadSamplesIncludeFirstAndLast) {
  EXPECT_EQ(SpreadSamples(128, 2), (std::vector<int64_t>{0, 127}));
  EXPECT_EQ(SpreadSamples(10, 4), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(SpreadSamples(5, 1), (std::vector<int64_t>{0}));
  EXPECT_EQ(SpreadSamples(3, 3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(SpreadSamples(3, 7), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(SpreadSamples(4, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  for (int64_t batch = 1; batch < 40; ++batch) {
    for (int64_t k = 2; k <= batch; ++k) {
      const std::vector<int64_t> s = SpreadSamples(batch, k);
      ASSERT_EQ(static_cast<int64_t>(s.size()), k);
      EXPECT_EQ(s.front(), 0);
      EXPECT_EQ(s.back(), batch - 1);
      for (size_t i = 1; i < s.size(); ++i) EXPECT_LT(s[i - 1], s[i]);
    }
  }
}

TEST(CliRunnerTest, CheckOutputComparesTheChosenSamples) {
  absl::StatusOr<Chain> chain = ParseChain("x:f32[4,2,1,1,3] | relu");
  ASSERT_TRUE(chain.ok()) << chain.status();
  const HostInputs inputs = RandomInputs(*chain, 7);
  HostTensor y{inputs.x.shape, inputs.x.data};  // relu of values in [0,1) is the identity
  absl::StatusOr<CheckResult> r = CheckOutput(*chain, inputs, y, {.samples = 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples, (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(r->pass);
  EXPECT_EQ(r->errors.count, 12);

  y.data[6] = std::nanf("");  // sample 1: not compared, but counted as unwritten
  r = CheckOutput(*chain, inputs, y, {.samples = 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->unwritten, 1);
  EXPECT_FALSE(r->pass);

  y.data[6] = inputs.x.data[6];
  y.data[23] += 1e-3f;  // sample 3: compared
  r = CheckOutput(*chain, inputs, y, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->pass);
  r = CheckOutput(*chain, inputs, y, {.rtol = 1, .atol = 1});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->pass);
}

// ---------------------------------------------------------------------------------------------
// The binary.

constexpr char kSpec[] =
    "x:f32[2,3,6,6,6] | conv3d(out=8,k=3) | swish | group_norm(groups=4) | hardswish";

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

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("fusejit_cli_") + info->name() + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "home");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs the fusejit binary with `args`, HOME and FUSEJIT_CACHE_DIR inside this test's folder, and
  // the NAME=VALUE variables of `extra_env` (replacing those of the same name).
  Result Run(const std::vector<std::string>& args,
             const std::vector<std::string>& extra_env = {}) {
    const fs::path out_path = dir_ / "stdout", err_path = dir_ / "stderr";
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var = *e;
      const std::string name = var.substr(0, var.find('='));
      if (name == "HOME" || name == "XDG_CACHE_HOME" || name.rfind("FUSEJIT_", 0) == 0) continue;
      bool replaced = false;
      for (const std::string& e : extra_env) replaced |= e.rfind(name + "=", 0) == 0;
      if (!replaced) env.push_back(var);
    }
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    env.push_back("HOME=" + (dir_ / "home").string());
    env.push_back("FUSEJIT_CACHE_DIR=" + (dir_ / "cache").string());
    std::vector<std::string> argv_s = {FUSEJIT_CLI_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv, envp;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    const pid_t pid = fork();
    if (pid == 0) {
      const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    Result r;
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
      ADD_FAILURE() << "could not run " << FUSEJIT_CLI_PATH << ": " << std::strerror(errno);
      return r;
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadFile(out_path);
    r.err = ReadFile(err_path);
    return r;
  }

  fs::path dir_;
};

TEST_F(CliTest, TopLevelHelpListsTheCommands) {
  for (const char* help : {"--help", "help", "-h"}) {
    Result r = Run({help});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const char* command : {"run", "compile", "explain", "seeds", "cache"}) {
      EXPECT_THAT(r.out, HasSubstr(std::string("  ") + command + " ")) << command;
    }
  }
  Result r = Run({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: fusejit <command>"));
  r = Run({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  // --version: the build, which tuning records carry.
  r = Run({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(GeneratorBuild()) + "\n");
}

TEST_F(CliTest, EveryCommandHelpMentionsItsFlags) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> commands = {
      {"run",
       {"--input", "--param", "--output", "--seed", "--check", "--check-samples", "--rtol",
        "--atol", "--reps", "--strategy", "--dump"}},
      {"compile", {"--arch", "--strategy", "--dump", "--no-cache"}},
      {"explain", {"--arch", "--strategy", "--dump"}},
      {"seeds", {"--check-samples", "--reps", "--no-cache"}},
  };
  for (const auto& [command, flags] : commands) {
    Result r = Run({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("usage: fusejit " + command)) << command;
    for (const std::string& flag : flags) EXPECT_THAT(r.out, HasSubstr(flag + " ")) << command;
  }
  Result r = Run({"cache", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--cache-dir"));
}

TEST_F(CliTest, CompileForSm90PrintsTheTimings) {
  Result r = Run({"compile", kSpec, "--arch", "sm_90"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("arch:      sm_90"));
  EXPECT_THAT(r.out, HasSubstr("strategy:  "));
  EXPECT_THAT(r.out, HasSubstr("plan:      "));
  EXPECT_THAT(r.out, HasSubstr("codegen:   "));
  EXPECT_THAT(r.out, testing::ContainsRegex("NVRTC: +[0-9.]+ ms"));
  EXPECT_THAT(r.out, HasSubstr("cache:     miss"));
  EXPECT_THAT(r.out, testing::ContainsRegex("cubin: +[1-9][0-9]* bytes"));

  // The second process finds the cubin in this test's cache directory.
  r = Run({"compile", kSpec, "--arch=sm_90"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cache:     hit"));
  EXPECT_THAT(r.out, HasSubstr("NVRTC:     skipped"));
  r = Run({"compile", kSpec, "--arch=sm_90", "--no-cache"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cache:     off"));
}

TEST_F(CliTest, BadSpecExitsTwoWithTheParsersMessage) {
  const std::string spec = "x:f32[2,3,6,6,6] | conv3d(out=8,k=3) | group_norm(groups=5)";
  const absl::Status parse = ParseChain(spec).status();
  ASSERT_FALSE(parse.ok());
  for (const char* command : {"compile", "explain", "run"}) {
    Result r = Run({command, spec});
    EXPECT_EQ(r.exit_code, 2) << command;
    EXPECT_THAT(r.err, HasSubstr(std::string(parse.message()))) << command;
    EXPECT_EQ(r.out, "") << command;
  }
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  Result r = Run({"compile", kSpec, "--arch", "90"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("'90' is not an architecture"));
  r = Run({"compile", kSpec, "--strategy", "magic"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown strategy 'magic'; strategies: "));
  r = Run({"run", kSpec, "--reps", "many"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--reps: 'many' is not an integer"));
  r = Run({"explain", kSpec, "--frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown flag --frobnicate for 'fusejit explain'; valid flags: "));
  r = Run({"compile"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing argument SPEC"));
}

TEST_F(CliTest, RunWithoutDriverSaysSo) {
  if (jit::DriverAvailable()) GTEST_SKIP() << "a CUDA driver is present: run would launch";
  Result r = Run({"run", kSpec, "--check"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no CUDA driver found"));
}

TEST_F(CliTest, ExplainPrintsKernelsAndWritesTheSource) {
  const fs::path dump = dir_ / "dump";
  Result r = Run({"explain", kSpec, "--arch", "sm_80", "--dump", dump.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("kernel 0"));
  EXPECT_THAT(r.out, HasSubstr("grid("));
  EXPECT_THAT(r.out, HasSubstr("workspace"));
  // The source path is printed and the file is there.
  std::string path;
  std::istringstream words(r.out);
  for (std::string w; words >> w;) {
    if (w.size() > 3 && w.compare(w.size() - 3, 3, ".cu") == 0) path = w;
  }
  ASSERT_FALSE(path.empty()) << r.out;
  EXPECT_EQ(path.rfind(dump.string(), 0), 0u) << path;
  EXPECT_TRUE(fs::is_regular_file(path)) << path;
  EXPECT_THAT(ReadFile(path), HasSubstr("conv3d(out=8,k=3)"));
}

// --config: a launch configuration instead of the default; a bad one is refused with the reason.
TEST_F(CliTest, ExplainTakesAConfig) {
  const std::string spec = "x:f32[4,256,8,8,8] | conv3d(out=256,k=3,padding=1) | gelu";
  Result r = Run({"explain", spec, "--arch", "sm_90", "--config",
                  "igemm-store:wg=1,stages=4,async=1,bn=128,split=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("config: igemm-store:wg=1,stages=4,async=1,bn=128,split=2"));
  EXPECT_THAT(r.out, HasSubstr("fj_igemm_wgmma_split"));
  r = Run({"explain", spec, "--arch", "sm_90", "--config",
           "igemm-store:wg=1,stages=4,async=1,bn=128,split=9"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("split 9 is not in [1, 8]"));
}

// The source path `explain` printed (the last word ending in .cu).
std::string PrintedSourcePath(const std::string& out) {
  std::string path;
  std::istringstream words(out);
  for (std::string w; words >> w;) {
    if (w.size() > 3 && w.compare(w.size() - 3, 3, ".cu") == 0) path = w;
  }
  return path;
}

TEST_F(CliTest, ExplainWritesIntoANewPrivateFolderAndKeepsOnlyTheNewest) {
  const fs::path tmp = dir_ / "tmp";
  fs::create_directories(tmp);
  // Older dumps of this user (private folders), more than are kept, and someone else's look-alike
  // (not private: never touched).
  for (int i = 0; i < 12; ++i) {
    const fs::path old = tmp / ("fusejit-explain.old" + std::string(1, static_cast<char>('a' + i)) + "zz");
    ASSERT_EQ(::mkdir(old.c_str(), 0700), 0);
    fs::last_write_time(old, fs::file_time_type::clock::now() - std::chrono::hours(24 + i));
  }
  const fs::path shared = tmp / "fusejit-explain.shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0755), 0);
  fs::last_write_time(shared, fs::file_time_type::clock::now() - std::chrono::hours(48));

  Result r = Run({"explain", kSpec, "--arch", "sm_90"}, {"TMPDIR=" + tmp.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string path = PrintedSourcePath(r.out);
  const std::string prefix = (tmp / "fusejit-explain.").string();
  ASSERT_EQ(path.rfind(prefix, 0), 0u) << r.out;
  const fs::path folder = fs::path(path).parent_path();
  struct stat st;
  ASSERT_EQ(::lstat(folder.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "the dump folder is private";
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_THAT(ReadFile(path), HasSubstr("conv3d(out=8,k=3)"));
  int ours = 0;
  for (const auto& e : fs::directory_iterator(tmp)) {
    ours += e.path().filename().string().rfind("fusejit-explain.", 0) == 0 &&
            e.path() != shared;
  }
  EXPECT_EQ(ours, 10) << "the newest 10 private dump folders are kept, the rest deleted";
  EXPECT_TRUE(fs::exists(folder));
  EXPECT_TRUE(fs::exists(shared)) << "a folder that is not private is never deleted";
  EXPECT_FALSE(fs::exists(tmp / "fusejit-explain.oldlzz")) << "the oldest was kept";

  // A second run: another new folder, not the first one reused.
  r = Run({"explain", kSpec, "--arch", "sm_90"}, {"TMPDIR=" + tmp.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(fs::path(PrintedSourcePath(r.out)).parent_path(), folder);
}

TEST_F(CliTest, DumpsNeverFollowLinksAndRefuseSharedOrLinkedFolders) {
  // The attack of a fixed /tmp folder: a link where a dump file goes, to a file the victim can
  // write. The dump replaces the link; the file it pointed to is untouched.
  const fs::path dump = dir_ / "dump";
  const fs::path victim = dir_ / "victim.txt";
  fs::create_directories(dump / "templates");
  fs::permissions(dump, fs::perms::owner_all, fs::perm_options::replace);
  { std::ofstream(victim) << "precious"; }
  fs::create_symlink(victim, dump / "templates" / "common.cuh");
  Result r = Run({"explain", kSpec, "--arch", "sm_90", "--dump", dump.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dump / "templates" / "common.cuh")));

  // A folder others can write (like /tmp), a folder that is a link, and the same through
  // FUSEJIT_DUMP_DIR: refused as invalid input (exit 2), nothing written.
  const fs::path shared = dir_ / "shared";
  fs::create_directories(shared);
  fs::permissions(shared, fs::perms::all, fs::perm_options::replace);
  const fs::path link = dir_ / "link";
  fs::create_symlink(dump, link);
  r = Run({"explain", kSpec, "--arch", "sm_90", "--dump", shared.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("writable by group or others (mode 0777)"));
  r = Run({"compile", kSpec, "--arch", "sm_90", "--dump", link.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is a symbolic link"));
  r = Run({"compile", kSpec, "--arch", "sm_90"}, {"FUSEJIT_DUMP_DIR=" + shared.string()});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("FUSEJIT_DUMP_DIR: refusing dump folder"));
  r = Run({"explain", kSpec, "--arch", "sm_90", "--dump="});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(fs::is_empty(shared));
}

TEST_F(CliTest, ArchAndStrategyErrorsAreAlwaysUsageErrors) {
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--arch", ""}, {"--arch="}, {"--arch", "sm_10"}, {"--arch", "sm_9"},
           {"--arch", "compute_90"}, {"--arch", "sm_90x"}, {"--strategy="},
           {"--strategy", "nope"}}) {
    std::vector<std::string> args = {"compile", kSpec};
    args.insert(args.end(), flags.begin(), flags.end());
    Result r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(flags) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--")) << ::testing::PrintToString(flags);
  }
  // A strategy that does not apply is refused before any compile (as one that does not handle
  // the chain's dtype).
  Result r = Run({"compile", "x:f64[2,3,6,6,6] | relu", "--arch", "sm_90", "--strategy",
                  "store-normalize"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = Run({"compile", "x:f32[2,3,6,6,6] | relu", "--arch", "sm_90", "--strategy",
           "igemm-store-normalize"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

// Every command that compiles takes --precision fp32|tf32 and refuses anything else as a usage
// error naming the choices, before compiling or touching a device.
TEST_F(CliTest, PrecisionFlagIsCheckedByEveryCompilingCommand) {
  for (const char* command : {"compile", "explain", "bench", "autotune"}) {
    Result r = Run({command, kSpec, "--precision", "fp16"});
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--precision fp16: expected fp32 or tf32")) << command;
  }
  Result r = Run({"compile", kSpec, "--arch", "sm_90", "--precision", "tf32", "--no-cache"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CliTest, SeedsWithoutGpuCompilesForSm90) {
  if (jit::DriverAvailable()) GTEST_SKIP() << "a CUDA driver is present: seeds would run on it";
  Result r = Run({"seeds"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("no CUDA driver found"));
  EXPECT_THAT(r.out, HasSubstr("compile ms"));
  for (const char* id : {"W1", "W2", "W3", "W4"}) {
    EXPECT_THAT(r.out, testing::ContainsRegex(std::string(id) + " +\\[[0-9,]+\\] +sm_90 +[a-z-]+ +"
                                                                "[0-9]+\\.[0-9] "))
        << id;
  }
  EXPECT_THAT(r.out, HasSubstr("launching needs an NVIDIA GPU and its driver"));
  EXPECT_THAT(r.out, Not(HasSubstr("FAIL")));
}

// Writes a .npy of float64 values by hand (fusejit only ever writes float32).
void WriteFloat64Npy(const fs::path& path, const Shape& shape) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  const uint16_t len = static_cast<uint16_t>(header.size());
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  const std::vector<double> data(NumElements(shape), 0.5);
  f.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(double));
}

TEST_F(CliTest, RunRefusesBadInputFilesBeforeTouchingTheGpu) {
  const fs::path f64 = dir_ / "x64.npy";
  WriteFloat64Npy(f64, {2, 3, 6, 6, 6});
  Result r = Run({"run", kSpec, "--input", f64.string()});
  EXPECT_EQ(r.exit_code, 2);  // invalid input, like a bad spec
  EXPECT_THAT(r.err, HasSubstr("--input: " + f64.string()));
  EXPECT_THAT(r.err, HasSubstr("float64"));
  EXPECT_THAT(r.err, HasSubstr("float32"));

  const fs::path wrong = dir_ / "w.npy";
  ASSERT_TRUE(WriteNpy(wrong.string(), HostTensor{{8, 3, 3, 3}, std::vector<float>(216)}).ok());
  r = Run({"run", kSpec, "--param", "0.weight=" + wrong.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("has shape [8,3,3,3] but 0.weight must have shape [8,3,3,3,3]"));

  r = Run({"run", kSpec, "--input", (dir_ / "missing.npy").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing.npy"));

  // Only regular files are read: a folder, a FIFO (no writer: opening must not block) and a
  // device are refused before anything is read, as input errors.
  const fs::path fifo = dir_ / "fifo.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& special : {dir_.string(), fifo.string(), std::string("/dev/zero")}) {
    r = Run({"run", kSpec, "--param", "0.weight=" + special});
    EXPECT_EQ(r.exit_code, 2) << special << r.err;
    EXPECT_THAT(r.err, HasSubstr("not a regular file")) << special;
  }

  r = Run({"run", kSpec, "--param", "1.weight=" + wrong.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--param 1.weight: the chain has no parameter of that name; its "
                               "parameters: 0.weight, 0.bias, 2.weight, 2.bias"));
  r = Run({"run", kSpec, "--param", "0.weight"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("expected NAME=FILE.npy"));
}

}  // namespace
}  // namespace fusejit::tools
