// What users would otherwise call on CUDA, measured beside the allocator:
// cudaMallocManaged+cudaFree, the CUDA 13 managed memory pool, and
// cudaMallocAsync on device memory. Used by //bench:cma_bench.
#ifndef CMA_BACKENDS_CUDA_CUDA_BENCH_H_
#define CMA_BACKENDS_CUDA_CUDA_BENCH_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cma {

// "managed_pair_ns", "managed_mempool_pair_ns", "async_device_pair_ns".
std::vector<std::string> CudaBaselineNames();
// Median over `reps` batches of the host time of one alloc+free pair,
// stream-ordered pairs included up to the stream's completion.
absl::StatusOr<double> MeasureCudaBaseline(const std::string& name, int device,
                                           std::size_t bytes, int reps);

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_BENCH_H_
