// HIP errors as absl::Status: the call, the error's name and description.
// Out of memory is kResourceExhausted; bad values, devices and handles are
// kInvalidArgument; unsupported features kUnimplemented.
#ifndef CMA_BACKENDS_HIP_HIP_STATUS_H_
#define CMA_BACKENDS_HIP_HIP_STATUS_H_

#include <hip/hip_runtime_api.h>

#include "absl/status/status.h"
#include "backends/hip/hip_api.h"

namespace cma {

absl::Status HipStatus(const HipApi& hip, hipError_t err, const char* call);

}  // namespace cma

#endif  // CMA_BACKENDS_HIP_HIP_STATUS_H_
