// Test main: GoogleTest plus Abseil's failure signal handler, so a crash (on the GPU machine, say)
// prints a symbolized stack trace instead of a bare "Segmentation fault".
#include <gtest/gtest.h>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"

int main(int argc, char** argv) {
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler({});
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
