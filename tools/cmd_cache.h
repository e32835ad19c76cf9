// tools/cmd_cache.h: `fusejit cache stats|list|verify|clear [--cache-dir DIR]`.
#ifndef FUSEJIT_TOOLS_CMD_CACHE_H_
#define FUSEJIT_TOOLS_CMD_CACHE_H_

#include <ostream>
#include <string>
#include <vector>

namespace fusejit::tools {

// args: the words after `fusejit cache`, e.g. {"verify", "--fix"}. Output goes to out; errors to
// err. Returns the process exit status: 0 success, 1 a failed operation or bad entries found by
// verify, 2 a usage error. The directory is --cache-dir, else as the library resolves it
// (FUSEJIT_CACHE_DIR, XDG_CACHE_HOME, HOME); it is never created by these commands.
int RunCacheCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_CMD_CACHE_H_
