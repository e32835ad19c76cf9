// reference/npy.h: NumPy .npy files of float32 tensors, for exchanging inputs, parameters and
// outputs with Python (np.save / np.load).
//
// Only float32, little-endian, C order is accepted ('<f4', fortran_order False): the type of
// every fusejit tensor. Anything else is refused with an error naming the file, what was found and
// what would be accepted, e.g.
//   "x.npy: dtype '<f8' (float64) is not supported; fusejit reads float32 little-endian ('<f4')"
// Convert in Python first: np.save(path, np.ascontiguousarray(a, dtype='<f4')).
//
// Thread safety: both functions may run concurrently (distinct temporary names per call).
#ifndef FUSEJIT_REFERENCE_NPY_H_
#define FUSEJIT_REFERENCE_NPY_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusejit/reference.h"

namespace fusejit {

// Reads a .npy file of format version 1.0, 2.0 or 3.0. Shapes of any rank, () and (0,) included.
// Errors: unreadable file, bad magic, unsupported version, malformed or overlong (> 10000 bytes,
// numpy's own limit) header, dtype other than '<f4', fortran_order True, negative dimensions, and
// data bytes that do not match the shape (truncated or trailing).
// Only a regular file is read (FIFOs, devices and folders are refused before any byte is read),
// of at most 4 * 2^31 data bytes plus the header. Errors: NotFound/PermissionDenied (cannot
// open), InvalidArgument (anything wrong with the file or its content), Internal/DataLoss (a read
// error, a file that shrank while read).
absl::StatusOr<HostTensor> ReadNpy(const std::string& path);

// The same checks on the bytes of a whole .npy file held in memory; `name` is used in messages.
absl::StatusOr<HostTensor> ParseNpy(std::string_view bytes, const std::string& name);

// Writes a .npy file of format version 1.0. The file is written under a temporary name in the same
// folder and renamed over `path`, so readers never see a partial file; every write, close and
// rename is checked. REQUIRES nothing: a tensor whose data size does not match its shape is
// refused with an error.
absl::Status WriteNpy(const std::string& path, const HostTensor& tensor);

}  // namespace fusejit

#endif  // FUSEJIT_REFERENCE_NPY_H_
