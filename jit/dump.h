// jit/dump.h (internal): where generated sources are written for people to read (`fusejit
// explain`, FUSEJIT_DUMP_DIR / --dump, the source of a failed NVRTC compile), written so that no
// other local user can redirect, replace or block the writes.
//
// - Default folders (explain, failed compiles) are new private folders made with mkdtemp(3) under
//   $TMPDIR (else /tmp): $TMPDIR/fusejit-<kind>.XXXXXX, mode 0700, one per dump. Only the newest
//   kKeepDumps of this user's folders of each kind are kept; older ones are deleted when a new one
//   is made (only folders that are this user's, 0700 and not symbolic links).
// - A folder the user names is created (0700) when missing; it must be a directory (not a symbolic
//   link), owned by this user and not writable by group or others; anything else is refused with
//   an error saying why.
// - Files are written under a fresh temporary name opened with O_CREAT|O_EXCL|O_NOFOLLOW and
//   renamed over the final name, so an existing link there is replaced, never followed.
//
// Thread-safe.
#ifndef FUSEJIT_JIT_DUMP_H_
#define FUSEJIT_JIT_DUMP_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusejit::jit {

inline constexpr size_t kKeepDumps = 10;

// Makes a new private folder for one dump of `kind` ("explain", "failed") and deletes this user's
// older folders of that kind beyond the newest kKeepDumps. Returns its path.
absl::StatusOr<std::string> NewPrivateDumpDir(std::string_view kind);

// Checks the folder `dir` (creating it and its missing parents when absent) for dumps: a
// directory, not a symbolic link, owned by this user, not writable by group or others. Errors
// name the folder and the reason (FailedPrecondition for a folder refused, else the errno's code).
absl::Status PrepareDumpDir(const std::string& dir);

// Writes `text` to dir/name (name: a plain file name, no '/') atomically: temp file (O_EXCL,
// O_NOFOLLOW, 0600) in dir, write, close, rename. Every result is checked.
absl::Status WriteDumpFile(const std::string& dir, const std::string& name, std::string_view text);

}  // namespace fusejit::jit

#endif  // FUSEJIT_JIT_DUMP_H_
