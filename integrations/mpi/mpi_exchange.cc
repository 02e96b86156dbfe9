#include "integrations/mpi/mpi_exchange.h"

namespace cma {
namespace {

int MpiAllGather(void* ctx, const void* send, size_t len, void* recv) {
  MPI_Comm comm = *static_cast<MPI_Comm*>(ctx);
  const int rc = MPI_Allgather(const_cast<void*>(send), static_cast<int>(len), MPI_BYTE, recv,
                               static_cast<int>(len), MPI_BYTE, comm);
  return rc == MPI_SUCCESS ? 0 : 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Exchange>> MakeMpiExchange(MPI_Comm comm, absl::Duration timeout) {
  int rank = 0, size = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
    return absl::InvalidArgumentError("MPI exchange: not a valid communicator");
  }
  return MakeCallbackExchange(MpiAllGather, &comm, rank, size, timeout);
}

}  // namespace cma
