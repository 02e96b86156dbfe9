// Oversubscription (config `oversubscribe:1`): how a device's managed budget
// splits into the part that lives in device memory and the part that lives
// in host memory, which the GPU reads and writes over the link.
//
// Why a host part rather than letting the driver evict: managed pages beyond
// the device migrate on every fault, a 2 MiB page at a time, and the driver
// evicts whatever it likes, so work larger than the device runs many times
// slower than in memory. An allocation placed on the host (preferred there,
// mapped for the device) never faults and never migrates: each access costs
// link bandwidth only. The allocator fills the device part first and places
// what does not fit there on the host, so the steady state of a repeating
// workload (training steps, decoding) makes no migration at all.
//
// Pure functions: no locks, no backend calls.
#ifndef CMA_POLICY_OVERSUBSCRIPTION_H_
#define CMA_POLICY_OVERSUBSCRIPTION_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "policy/config.h"
#include "policy/placement_policy.h"
#include "policy/size_policy.h"

namespace cma {

struct TierBudgets {
  std::size_t device = 0;  // managed bytes this device may populate
  std::size_t host = 0;    // managed bytes it may place on the host (0: none)
};

// The budgets of `device` given what it has free and what the host has
// available now. Without oversubscription: the managed budget (absolute or
// a fraction of `device_free`) and no host part, as before. With it: the
// total is the absolute managed budget, or `device_free` plus half of
// `host_available`; the device part is `device_free` less the configured
// headroom, and the rest is the host part. kInvalidArgument, naming both
// memories, when the total exceeds what the device and the host can hold,
// or when the headroom leaves the device nothing.
absl::StatusOr<TierBudgets> PlanTierBudgets(const AllocatorConfig& config, int device,
                                            std::size_t device_free,
                                            std::size_t host_available);

// The advice for a segment placed on the host for `device`: preferred
// there (the driver never migrates it to the device on a fault) and mapped
// for the device (its accesses go over the link, with no fault).
AdviceList HostTierAdvice(int device);

// Whether a cached host segment of `cached` bytes may serve a request of
// `rounded` bytes (host segments are never split): it holds it, and wastes
// at most an eighth of it beyond the 2 MiB rounding.
bool HostBlockFits(std::size_t cached, std::size_t rounded);

}  // namespace cma

#endif  // CMA_POLICY_OVERSUBSCRIPTION_H_
