// Small CUDA kernels for tests and benchmarks: fill and verify memory with a
// pattern from the device, so that "the device wrote it" is a real kernel.
//
// Each launch is asynchronous on `stream`; errors come back as Status (the
// launch error, not the kernel's completion).
#ifndef CMA_BACKENDS_CUDA_KERNELS_H_
#define CMA_BACKENDS_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "backends/backend.h"

namespace cma {

// Writes word i of `p` as `seed + i` (32-bit words; bytes a multiple of 4).
absl::Status LaunchFill(void* p, std::size_t bytes, std::uint32_t seed, Stream stream);
// Counts words of `p` that differ from `seed + i` into *mismatches (device or
// managed memory; zeroed by the caller).
absl::Status LaunchCheck(const void* p, std::size_t bytes, std::uint32_t seed,
                         unsigned long long* mismatches, Stream stream);
// Spins on the device for about `cycles` clock cycles: "a kernel still uses
// this block" for ordering tests.
absl::Status LaunchSpin(long long cycles, Stream stream);
// Reads every word (a sum nobody looks at), for bandwidth measurement.
absl::Status LaunchRead(const void* p, std::size_t bytes, unsigned long long* sink, Stream stream);

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_KERNELS_H_
