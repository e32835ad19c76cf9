// reference/file_read.h: reading a file the user named (a manifest, a .npy tensor) safely: only a
// regular file is read (a FIFO, device, socket or folder is refused before anything is read, and
// opening never blocks), and only up to a size limit, checked before reading.
#ifndef FUSEJIT_REFERENCE_FILE_READ_H_
#define FUSEJIT_REFERENCE_FILE_READ_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace fusejit {

// The whole content of the regular file at `path` (symbolic links are followed), at most
// max_bytes. `what` names the file's role in messages ("manifest", ".npy file").
// Errors: NotFound / PermissionDenied (cannot open), InvalidArgument (not a regular file, or
// larger than max_bytes: the message names the limit), Internal (a read error).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                            const std::string& what);

}  // namespace fusejit

#endif  // FUSEJIT_REFERENCE_FILE_READ_H_
