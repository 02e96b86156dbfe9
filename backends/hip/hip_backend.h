// HipBackend: the Backend interface on the HIP runtime (ROCm), loaded at run
// time (hip_api.h). Managed memory, advice (including HIP's coarse-grain
// advice), prefetch (the int-device form, valid through ROCm 6), range
// attributes, streams, events and VMM where the device provides it.
// Multicast does not exist on HIP and reports kUnimplemented; discards are
// no-ops (keeping contents is a valid outcome of "contents are dead").
//
// Without XNACK in effect (the target name's xnack feature; HSA_XNACK=1 asks
// for it) managed memory does not migrate on fault: DeviceFacts'
// page_fault_migration, xnack and managed_memory_note say so and why
// (hip_managed_rules.h), and the benchmark JSON records them. The runtime is
// CMA_HIP_LIBRARY when set, else libamdhip64.so (tests/gpu/hip_on_cuda is a
// forwarding one that runs this backend on an NVIDIA GPU).
//
// Thread safety: all methods are safe to call concurrently.
#ifndef CMA_BACKENDS_HIP_HIP_BACKEND_H_
#define CMA_BACKENDS_HIP_HIP_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace cma {

// kUnavailable when the HIP runtime is missing or sees no device (with the
// runtime's reason).
absl::StatusOr<std::unique_ptr<Backend>> MakeHipBackend();

}  // namespace cma

#endif  // CMA_BACKENDS_HIP_HIP_BACKEND_H_
