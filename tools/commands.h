// tools/commands.h: the commands of the `fusejit` CLI, one file each (cmd_*.cc). Each takes the
// words after its name, writes results to `out` and errors to `err`, and returns the process exit
// status (tools/common.h: 0 ok, 1 failure, 2 usage error). None throws or exits.
#ifndef FUSEJIT_TOOLS_COMMANDS_H_
#define FUSEJIT_TOOLS_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "tools/args.h"

namespace fusejit::tools {

// fusejit run SPEC: run on the GPU, optionally check against the CPU reference (cmd_run.cc).
const CommandSpec& RunSpec();
int RunCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// fusejit compile SPEC: generate and compile only; no GPU needed (cmd_compile.cc).
const CommandSpec& CompileSpec();
int CompileCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// fusejit explain SPEC: the plan, kernels, launch dimensions and the dumped source
// (cmd_explain.cc).
const CommandSpec& ExplainSpec();
int ExplainCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// fusejit seeds: the four seed chains, run and checked on a GPU, or compiled for sm_90 without
// one (cmd_seeds.cc).
const CommandSpec& BenchSpec();
int BenchCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// fusejit prewarm MANIFEST: compile a manifest's chains into the kernel cache ahead of time, in
// parallel (cmd_prewarm.cc).
const CommandSpec& PrewarmSpec();
int PrewarmCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// fusejit autotune SPEC... | --manifest FILE: measure launch configurations on the GPU and store
// the fastest in the tuning database (cmd_autotune.cc).
const CommandSpec& AutotuneSpec();
int AutotuneCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

const CommandSpec& SeedsSpec();
int SeedsCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_COMMANDS_H_
