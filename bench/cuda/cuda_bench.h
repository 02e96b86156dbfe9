// What users would otherwise call on CUDA, measured beside the allocator:
// cudaMallocManaged+cudaFree, the CUDA 13 managed memory pool, and
// cudaMallocAsync on device memory. Used by //bench:cma_bench.
#ifndef CMA_BACKENDS_CUDA_CUDA_BENCH_H_
#define CMA_BACKENDS_CUDA_CUDA_BENCH_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "nlohmann/json.hpp"

namespace cma {

// "managed_pair_ns", "managed_mempool_pair_ns", "async_device_pair_ns".
std::vector<std::string> CudaBaselineNames();
// Median over `reps` batches of the host time of one alloc+free pair,
// stream-ordered pairs included up to the stream's completion.
absl::StatusOr<double> MeasureCudaBaseline(const std::string& name, int device,
                                           std::size_t bytes, int reps);

// Fills out["migration"]: first device writes per placement policy, resident
// bandwidth, zero-copy moves both ways, a staged device-to-host move, raw
// prefetch and pinned copies (cuda_migration_bench.cc). Skips, saying so,
// when the device has under 8 GiB free: managed memory is never
// oversubscribed.
absl::Status CudaMigrationSuite(Backend& backend, int device, nlohmann::json& out);

// Bandwidth of device `writer` filling `bytes` at `peer` (a symmetric
// pointer to another device's memory) with a kernel, and of cudaMemcpyPeer
// between the same two devices, measured in one call.
struct PeerBandwidth {
  double peer_write_GBps = 0;
  double memcpy_peer_GBps = 0;
};
absl::StatusOr<PeerBandwidth> MeasurePeerBandwidth(void* peer, std::size_t bytes, int writer,
                                                   int owner);

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_BENCH_H_
