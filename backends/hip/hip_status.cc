#include "backends/hip/hip_status.h"

#include "absl/strings/str_cat.h"

namespace cma {

absl::Status HipStatus(const HipApi& hip, hipError_t err, const char* call) {
  if (err == hipSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (err == hipErrorOutOfMemory) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (err == hipErrorInvalidValue || err == hipErrorInvalidDevice ||
             err == hipErrorInvalidHandle || err == hipErrorInvalidResourceHandle ||
             err == hipErrorInvalidDevicePointer ||
             // ROCm's answer for a stream handle it does not know (a
             // destroyed or foreign stream), not a broken context.
             err == hipErrorContextIsDestroyed) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (err == hipErrorNotSupported) {
    code = absl::StatusCode::kUnimplemented;
  }
  return absl::Status(code, absl::StrCat(call, " failed: ", hip.hipGetErrorName(err), " (",
                                         hip.hipGetErrorString(err), ")"));
}

}  // namespace cma
