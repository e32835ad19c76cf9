// Compiles each template file named on the command line on its own through NVRTC (as the
// library's tests do), for sm_90, and prints the log and ptxas resource usage.
#include <nvrtc.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
int main(int argc, char** argv) {
  int bad = 0;
  for (int a = 1; a < argc; ++a) {
    std::ifstream f(argv[a]);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string src = ss.str();
    nvrtcProgram p;
    nvrtcCreateProgram(&p, src.c_str(), argv[a], 0, nullptr, nullptr);
    const char* arch = getenv("ARCH") ? getenv("ARCH") : "sm_90";
    std::string archopt = std::string("--gpu-architecture=") + arch;
    std::vector<const char*> opts = {archopt.c_str(), "-std=c++17",
                                     "-I/work/main/templates", "--ptxas-options=-v"};
    nvrtcResult r = nvrtcCompileProgram(p, (int)opts.size(), opts.data());
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(p, log.data());
    printf("== %s: %s\n%s\n", argv[a], nvrtcGetErrorString(r), log.c_str());
    bad |= r != NVRTC_SUCCESS;
    nvrtcDestroyProgram(&p);
  }
  return bad;
}
