// The generator's version and build: GeneratorVersion is part of every kernel-cache key (whose
// source hash covers the kernels themselves); GeneratorBuild, of every tuning record and policy
// decision, which depend on the planner too (fusejit.h).
#include <string>

#include "fusejit/fusejit.h"
#include "templates/embedded.h"

namespace fusejit {

const char* GeneratorVersion() { return "fusejit-0.1.0"; }

const char* GeneratorBuild() {
  static const std::string build =
      std::string(GeneratorVersion()) + "+g" + std::string(templates::GeneratorDigest());
  return build.c_str();
}

}  // namespace fusejit
