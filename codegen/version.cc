// The generator's version: part of every kernel-cache key and tuning record (fusejit.h).
#include "fusejit/fusejit.h"

namespace fusejit {

const char* GeneratorVersion() { return "fusejit-0.1.0"; }

}  // namespace fusejit
