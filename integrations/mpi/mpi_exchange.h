// The symmetric mode's exchange over an MPI communicator (Debian's OpenMPI).
//
// MPI carries the rendezvous (one MPI_Allgather of a socket path); the file
// descriptors of exported VMM handles then cross through a Unix socket, since
// MPI cannot carry them. So the ranks of `comm` must share a host; across
// hosts, fabric handles travel as bytes (HandleType::kFabric) where the
// device supports them. Collective over `comm`; waits are bounded by
// `timeout`. Thread safety: as Exchange.
#ifndef CMA_INTEGRATIONS_MPI_MPI_EXCHANGE_H_
#define CMA_INTEGRATIONS_MPI_MPI_EXCHANGE_H_

#include <mpi.h>

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"

namespace cma {

absl::StatusOr<std::unique_ptr<Exchange>> MakeMpiExchange(MPI_Comm comm, absl::Duration timeout);

}  // namespace cma

#endif  // CMA_INTEGRATIONS_MPI_MPI_EXCHANGE_H_
