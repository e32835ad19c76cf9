// fusejit/workloads.h: the four seed chains of ../shared/WORKLOADS.md (KernelBench level-2
// problems #60, #27, #61 and #23), used by the CLI's `seeds` command, the tests, the examples
// and the benchmarks.
#ifndef FUSEJIT_WORKLOADS_H_
#define FUSEJIT_WORKLOADS_H_

#include <string>
#include <vector>

namespace fusejit {

struct Workload {
  std::string id;     // "W1"
  std::string spec;   // canonical spec text
  std::string title;  // "convT + swish + group_norm + hardswish"
};

const std::vector<Workload>& SeedWorkloads();

}  // namespace fusejit

#endif  // FUSEJIT_WORKLOADS_H_
