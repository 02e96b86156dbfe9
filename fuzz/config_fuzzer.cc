// libFuzzer: CMA_ALLOC_CONF parsing never crashes, and every accepted config
// survives a round trip through ToString().
#include <cstdint>
#include <cstdlib>
#include <string>

#include "policy/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<cma::AllocatorConfig> c = cma::ParseAllocatorConfig(text);
  if (!c.ok()) {
    if (c.status().message().empty()) std::abort();  // errors always say why
    return 0;
  }
  absl::StatusOr<cma::AllocatorConfig> again = cma::ParseAllocatorConfig(c->ToString());
  if (!again.ok() || again->ToString() != c->ToString()) std::abort();
  return 0;
}
