// tools/manifest.h: the manifest of `fusejit prewarm`: the chains a deployment will run.
//
//   # fleet.txt
//   x:f32[{1,8,32},3,16,32,32] | conv3d(out=16,k=3) | relu           # 3 specs: N = 1, 8, 32
//   x:f32[4,3,8,8,8] | conv3d(out={8,16},k={3,[1,3,3]}) | {relu,swish}  # 2 x 2 x 2 = 8 specs
//
// - One spec per line (fusejit::ParseChain's grammar). '#' starts a comment that runs to the end
//   of the line; blank and comment-only lines are skipped.
// - A grid `{a,b,c}` anywhere in a line stands for each of its comma-separated alternatives in
//   turn; commas inside [] or () belong to an alternative (`k={3,[1,3,3]}`). A line with several
//   grids expands to their cross product, the leftmost grid varying slowest. Grids do not nest.
//   Alternatives are plain text, so a grid may hold shapes, argument values or op names.
// - Specs equal after canonicalization (FormatChain) are kept once, at their first appearance.
//
// Problems are located as "FILE:LINE:COLUMN: message" (1-based; the column counts bytes of the
// original line, also for ParseChain errors inside an expanded spec; for a grid line the message
// ends with the expanded spec it is about). A malformed line or spec is reported and skipped, so
// that a caller may still use the others; only an expansion beyond ManifestOptions::max_specs
// rejects the whole manifest.
//
// Thread safety: pure functions over values.
#ifndef FUSEJIT_TOOLS_MANIFEST_H_
#define FUSEJIT_TOOLS_MANIFEST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusejit/chain.h"

namespace fusejit::tools {

struct ManifestOptions {
  // The most specs (after grid expansion, duplicates included) a manifest may name in all.
  size_t max_specs = 100000;
  // The largest manifest file ReadManifest reads, and the longest line (without its newline).
  uint64_t max_bytes = uint64_t{16} << 20;
  size_t max_line_bytes = 16384;
};

struct ManifestEntry {
  Chain chain;
  std::string spec;      // canonical: FormatChain(chain)
  std::string location;  // "FILE:LINE" of its first appearance
};

struct Manifest {
  std::vector<ManifestEntry> entries;  // distinct chains, in order of first appearance
  std::vector<std::string> errors;     // "FILE:LINE:COLUMN: message", in line order
  size_t specs = 0;       // specs named after grid expansion, duplicates and errors included
  size_t duplicates = 0;  // specs equal (canonically) to an earlier one
  // Specs that could not be used: each bad spec of a line, or 1 for a line whose grids are
  // malformed. `errors` lists at most 5 per line, then a line counting the rest.
  size_t invalid_specs = 0;
};

// Parses manifest text; `file_name` is used in locations only.
// Errors (the manifest as a whole is refused): InvalidArgument when the specs would exceed
// options.max_specs, located at the first grid of the line that crosses the limit, or when a line
// is longer than options.max_line_bytes.
absl::StatusOr<Manifest> ParseManifest(std::string_view text, std::string_view file_name,
                                       const ManifestOptions& options = {});

// Reads and parses the file at `path` (locations name it as given). Only a regular file of at
// most options.max_bytes is read (reference/file_read.h).
// Errors: the file cannot be opened (NotFound, PermissionDenied), is not a regular file or is too
// large (InvalidArgument), a read error (Internal); those of ParseManifest.
absl::StatusOr<Manifest> ReadManifest(const std::string& path,
                                      const ManifestOptions& options = {});

}  // namespace fusejit::tools

#endif  // FUSEJIT_TOOLS_MANIFEST_H_
