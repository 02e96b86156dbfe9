// NCCL's communicator-window calls (ncclCommWindowRegister, NCCL 2.27+),
// loaded with dlopen at run time: nothing is linked or vendored, so one
// binary runs with whatever NCCL the framework brought, or none.
//
// The library is the one already in the process when there is one (a
// communicator must be used with the NCCL that made it: torch's, say), else
// CMA_NCCL_LIBRARY, else libnccl.so.2. A missing library or one older than
// 2.27 makes every call kUnimplemented naming what is missing.
//
// Thread safety: every function may be called concurrently; the table is
// loaded once. A CommHandle must be a live ncclComm_t: NCCL cannot tell a
// dangling pointer, and neither can cma.
#ifndef CMA_BACKENDS_CUDA_NCCL_API_H_
#define CMA_BACKENDS_CUDA_NCCL_API_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace cma {

absl::StatusOr<CommFacts> NcclCommFacts(CommHandle comm);
// Collective over `comm`, with NCCL_WIN_COLL_SYMMETRIC. On a non-blocking
// communicator each call here first waits for its previous operation (its
// initialisation, say), then for the call itself, each wait at most
// CMA_NCCL_TIMEOUT_S seconds (600 by default): then kDeadlineExceeded, and
// the communicator should be aborted. A bad CMA_NCCL_TIMEOUT_S:
// kInvalidArgument, nothing called.
absl::StatusOr<CommWindow> NcclRegisterWindow(CommHandle comm, void* ptr, std::size_t bytes);
absl::Status NcclDeregisterWindow(CommHandle comm, CommWindow window);

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_NCCL_API_H_
