#include "backends/hip/hip_managed_rules.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cma {

const char* XnackName(Xnack x) {
  switch (x) {
    case Xnack::kOn: return "on";
    case Xnack::kOff: return "off";
    default: return "absent";
  }
}

Xnack XnackFromArchName(absl::string_view arch_name) {
  // Features follow the processor name, each ':'-separated with a +/- sign.
  std::vector<absl::string_view> parts = absl::StrSplit(arch_name, ':');
  for (std::size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] == "xnack+") return Xnack::kOn;
    if (parts[i] == "xnack-") return Xnack::kOff;
  }
  return Xnack::kAbsent;
}

HipManagedMode DecideHipManagedMode(const HipManagedInputs& in) {
  HipManagedMode m;
  m.xnack = XnackFromArchName(in.arch_name);
  const std::string env =
      in.has_hsa_xnack ? absl::StrCat("HSA_XNACK=", in.hsa_xnack) : "HSA_XNACK unset";
  const std::string seen = absl::StrCat(
      "target ", in.arch_name.empty() ? "(unnamed)" : in.arch_name, ", ", env,
      ", concurrent managed access ", in.concurrent_managed_access ? 1 : 0,
      ", pageable memory access ", in.pageable_memory_access ? 1 : 0);
  switch (m.xnack) {
    case Xnack::kOn:
      // The runtime reports the mode in effect: faults are retried and
      // managed pages migrate to the GPU that touches them.
      m.page_fault_migration = true;
      m.note = absl::StrCat("XNACK on (", seen, "): managed memory migrates on GPU page faults");
      break;
    case Xnack::kOff:
      m.page_fault_migration = false;
      m.note = absl::StrCat(
          "XNACK off (", seen,
          "): managed memory moves only when prefetched; a GPU touch of a page elsewhere reads "
          "it remotely. ",
          in.has_hsa_xnack && in.hsa_xnack == "1"
              ? "HSA_XNACK=1 is set but did not take effect: the kernel driver (amdgpu "
                "noretry=0) or a virtualised GPU does not allow it"
              : "Run with HSA_XNACK=1 (and a kernel that allows it) for migration on fault");
      break;
    case Xnack::kAbsent:
      // No retry feature in the target name: either the GPU cannot retry
      // faults (HSA_XNACK changes nothing) or the runtime is not ROCm's; the
      // runtime's own attribute is then the only evidence.
      m.page_fault_migration = in.concurrent_managed_access;
      m.note = absl::StrCat(
          "no xnack feature in the target (", seen, "): ",
          in.concurrent_managed_access
              ? "the runtime reports concurrent managed access, taken as migration on fault"
              : "this GPU cannot migrate managed memory on fault; it moves only when "
                "prefetched",
          in.has_hsa_xnack && !in.concurrent_managed_access ? " (HSA_XNACK has no effect here)"
                                                            : "");
      break;
  }
  return m;
}

}  // namespace cma
