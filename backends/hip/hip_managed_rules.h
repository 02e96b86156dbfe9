// ROCm's rules for managed memory, as a pure decision from what the HIP
// runtime reports, so that they are tested on any machine.
//
// On ROCm, hipMallocManaged memory migrates on a GPU page fault only when
// XNACK (GPU page-fault retry) is on: the GPU must support it (MI200, MI300,
// some others) and the process must run with it on (HSA_XNACK=1, unless the
// kernel turns it on by default). The runtime's device target name then
// carries the feature as it is in effect: "gfx90a:sramecc+:xnack+" (on) or
// "...:xnack-" (off); a target without the feature cannot retry faults at
// all. Without XNACK the memory is still usable, but a page is moved only by
// an explicit prefetch (or a CPU touch); a GPU touch of a page that is not
// on the GPU reads it remotely and never moves it. Some devices then also
// report no concurrent managed access. The allocator therefore refuses the
// policies that leave placement to first touch (prefetch:none, on_move) and
// keeps populating pages with explicit prefetches.
//
// Thread safety: pure functions.
#ifndef CMA_BACKENDS_HIP_HIP_MANAGED_RULES_H_
#define CMA_BACKENDS_HIP_HIP_MANAGED_RULES_H_

#include <string>

#include "absl/strings/string_view.h"

namespace cma {

// What the runtime and the environment say.
struct HipManagedInputs {
  std::string arch_name;                   // hipDeviceProp_t::gcnArchName
  bool concurrent_managed_access = false;  // hipDeviceAttributeConcurrentManagedAccess
  bool pageable_memory_access = false;     // hipDeviceAttributePageableMemoryAccess
  bool has_hsa_xnack = false;              // HSA_XNACK is set ...
  std::string hsa_xnack;                   // ... to this
};

enum class Xnack { kOn, kOff, kAbsent };  // absent: the target names no xnack feature
const char* XnackName(Xnack x);  // "on", "off", "absent"

struct HipManagedMode {
  Xnack xnack = Xnack::kAbsent;
  bool page_fault_migration = false;
  // One sentence for logs, the benchmark's JSON and errors: what was seen,
  // what it means for placement, and how to get migration where possible.
  std::string note;
};

// The xnack feature of a target name such as "gfx90a:sramecc+:xnack-".
Xnack XnackFromArchName(absl::string_view arch_name);

HipManagedMode DecideHipManagedMode(const HipManagedInputs& in);

}  // namespace cma

#endif  // CMA_BACKENDS_HIP_HIP_MANAGED_RULES_H_
