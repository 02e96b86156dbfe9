#include "policy/oversubscription.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace cma {
namespace {

std::string GiB(std::size_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace

absl::StatusOr<TierBudgets> PlanTierBudgets(const AllocatorConfig& config, int device,
                                            std::size_t device_free,
                                            std::size_t host_available) {
  TierBudgets b;
  if (!config.oversubscribe) {
    b.device = config.managed_budget_bytes != 0
                   ? config.managed_budget_bytes
                   : static_cast<std::size_t>(static_cast<double>(device_free) *
                                              config.managed_budget_fraction);
    return b;
  }
  if (config.device_headroom >= device_free) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: oversubscribe:1 leaves device %d nothing: device_headroom %s of %s free", device,
        GiB(config.device_headroom), GiB(device_free)));
  }
  b.device = device_free - config.device_headroom;
  const std::size_t total = config.managed_budget_bytes != 0
                                ? config.managed_budget_bytes
                                : device_free + host_available / 2;
  if (total > device_free + host_available) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: managed_budget %s cannot fit: device %d has %s free and the host %s available "
        "(%s together)",
        GiB(total), device, GiB(device_free), GiB(host_available),
        GiB(device_free + host_available)));
  }
  b.device = std::min(b.device, total);
  b.host = total - b.device;
  return b;
}

AdviceList HostTierAdvice(int device) {
  return {{Advice::kSetPreferredLocation, Location::Host()},
          {Advice::kSetAccessedBy, Location::Device(device)}};
}

bool HostBlockFits(std::size_t cached, std::size_t rounded) {
  const std::size_t pages = (rounded + kPageSize - 1) / kPageSize * kPageSize;
  return cached >= rounded && cached <= pages + pages / 8;
}

}  // namespace cma
