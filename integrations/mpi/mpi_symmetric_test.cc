// Run under mpirun with 2-4 ranks (mpi_symmetric_test.sh): each rank is one
// process with one emulated device; a symmetric allocation is visible to all,
// reused from cache, and size mismatches are reported on every rank.
// Prints "N passed, N failed" for this rank; exits non-zero on failure.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "allocator/symmetric/symmetric_heap.h"
#include "backends/host/host_backend.h"
#include "integrations/mpi/mpi_exchange.h"

namespace cma {
namespace {

int passed = 0, failed = 0;

void Expect(bool ok, int rank, const char* what) {
  (ok ? passed : failed)++;
  if (!ok) std::fprintf(stderr, "rank %d: FAILED %s\n", rank, what);
}

void Run(int rank, int world) {
  HostBackend backend({.device_count = 1});
  auto x = MakeMpiExchange(MPI_COMM_WORLD, absl::Seconds(30));
  Expect(x.ok(), rank, "MPI exchange");
  if (!x.ok()) return;
  SymmetricGroup g;
  g.world_size = world;
  g.local_ranks = {rank};
  g.local_devices = {0};
  auto heap = SymmetricHeap::Create(backend, g, std::move(*x));
  Expect(heap.ok(), rank, "heap");
  if (!heap.ok()) return;
  auto a = (*heap)->Allocate(1 << 20);
  Expect(a.ok(), rank, "collective allocation");
  if (!a.ok()) return;
  for (int p = 0; p < world; ++p) static_cast<std::int32_t*>((*a)->peers[p])[rank] = 1000 * p + rank;
  MPI_Barrier(MPI_COMM_WORLD);
  bool seen = true;
  for (int p = 0; p < world; ++p) {
    seen &= static_cast<std::int32_t*>((*a)->peers[rank])[p] == 1000 * rank + p;
  }
  Expect(seen, rank, "every peer's write visible in my buffer");
  const void* base = (*a)->base;
  Expect((*heap)->Free(*a).ok(), rank, "collective free");
  const auto exchanges = (*heap)->GetStats().exchanges;
  auto again = (*heap)->Allocate(1 << 20);
  // A hit: the same segments, agreed on in one small round (no handles move).
  Expect(again.ok() && (*again)->base == base && (*heap)->GetStats().exchanges == exchanges + 1,
         rank, "reuse from cache with one agreement round");
  if (again.ok()) (void)(*heap)->Free(*again);
  auto sym = (*heap)->Allocate((rank + 1) * 4096, /*make_symmetric=*/true);
  Expect(sym.ok() && (*sym)->bytes == static_cast<std::size_t>(world) * 4096, rank,
         "make_symmetric rounds up to the largest");
  if (sym.ok()) (void)(*heap)->Free(*sym);
  auto bad = (*heap)->Allocate(rank == 0 ? 3 << 20 : 5 << 20);
  Expect(!bad.ok() && bad.status().message().find("different sizes") != std::string::npos, rank,
         "mismatched sizes are an error on every rank");
  heap->reset();
  Expect(backend.LiveResources() == HostResourceCounts{}, rank, "nothing leaks");
}

}  // namespace
}  // namespace cma

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cma::Run(rank, world);
  std::printf("rank %d of %d: %d passed, %d failed\n", rank, world, cma::passed, cma::failed);
  const int mine = cma::failed;
  int total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
