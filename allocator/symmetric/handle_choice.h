// Which shareable handle a symmetric heap exports its memory as, decided
// once when the heap is created. Internal to allocator/symmetric:
// SymmetricOptions (symmetric_heap.h) states the public contract.
#ifndef CMA_ALLOCATOR_SYMMETRIC_HANDLE_CHOICE_H_
#define CMA_ALLOCATOR_SYMMETRIC_HANDLE_CHOICE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backends/backend.h"

namespace cma {

struct HandleChoice {
  HandleType type = HandleType::kPosixFd;
  // Why kFabric was asked for and kPosixFd chosen; empty otherwise.
  std::string fallback_reason;
};

// For `wanted` kFabric, probes every device of `devices` with a real
// allocation of `granularity` bytes, exported as a fabric handle and
// released: the device attribute can say yes while creation or export
// fails (CUDA without an IMEX channel). When a device cannot,
// `fabric_fallback` picks kPosixFd (one host only) if every device exports
// those, else the result is kUnimplemented naming the device and the
// probe's error. kPosixFd is returned as asked, unprobed (Create checks the
// device facts). Errors reading a device's facts, or releasing a probe,
// are returned as they are. Calls the backend only; no state.
absl::StatusOr<HandleChoice> ChooseHandleType(Backend& backend, absl::Span<const int> devices,
                                              HandleType wanted, bool fabric_fallback,
                                              std::size_t granularity);

}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_HANDLE_CHOICE_H_
