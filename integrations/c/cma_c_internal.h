// Shared by the C ABI's translation units (cma_c.cc, cma_symmetric_c.cc, ...);
// not part of the ABI.
#ifndef CMA_INTEGRATIONS_C_CMA_C_INTERNAL_H_
#define CMA_INTEGRATIONS_C_CMA_C_INTERNAL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/caching_managed_allocator.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "integrations/c/cma_c.h"
#include "nlohmann/json.hpp"

namespace cma {
namespace capi {

// The process-wide allocator, created from the environment on first use;
// nullptr (with the thread's last error set) when that fails.
CachingManagedAllocator* Get();
// Records `s` as the thread's last error; returns -1.
int Fail(const absl::Status& s);
// Runs `op` (absl::Status(CachingManagedAllocator&)) on the process's
// allocator: 0, or -1 with the reason in cma_last_error.
template <typename Op>
int WithAllocator(Op op) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::Status s = op(*a);
  return s.ok() ? 0 : Fail(s);
}
// The last PyTorch settings string cma_apply_pytorch_settings accepted ("" if
// none, or since cma_shutdown).
std::string PyTorchSettings();
// A malloc'ed copy for the caller to cma_string_free.
char* CopyString(const std::string& s);
// Adds the symmetric heaps' statistics to a stats object: for one device,
// the heaps serving a member on it (their bytes shared evenly among their
// local devices); for -1, all of them.
void AddSymmetricStats(int device, nlohmann::json& stats);
// Every symmetric heap's allocations, for the snapshot.
nlohmann::json SymmetricSnapshotJson();

// Shared by the symmetric heap's creates (cma_symmetric_c.cc,
// cma_symmetric_multi_host_c.cc): the checks every create makes on this
// process's own arguments (OK or why not, naming `who`); the heap
// registered for the C ABI (statistics, snapshots, handles); the members
// this process serves, from checked C arguments.
absl::Status CheckSymmetricCreate(const char* who, int world_size, const int* local_ranks,
                                  const int* local_devices, int n_local, double timeout_seconds);
cma_symmetric_heap* RegisterSymmetricHeap(std::unique_ptr<SymmetricHeap> heap,
                                          std::vector<int> local_devices,
                                          std::size_t signal_bytes);
SymmetricGroup SymmetricGroupOf(int world_size, const int* local_ranks, const int* local_devices,
                                int n_local);
// The options string of cma_symmetric_create (cma_c.h).
absl::StatusOr<SymmetricOptions> ParseSymmetricOptions(const char* text);

// Allocation history (cma_history.cc): no-ops unless cma_record_history
// enabled it.
void RecordAlloc(void* p, std::size_t size, int device, void* stream);
void RecordFree(void* p);

}  // namespace capi
}  // namespace cma

#endif  // CMA_INTEGRATIONS_C_CMA_C_INTERNAL_H_
