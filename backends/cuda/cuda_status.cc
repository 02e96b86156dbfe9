#include "backends/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "backends/cuda/driver_api.h"

namespace cma {
namespace {

absl::StatusCode CodeFor(bool oom, bool invalid, bool unsupported) {
  if (oom) return absl::StatusCode::kResourceExhausted;
  if (invalid) return absl::StatusCode::kInvalidArgument;
  if (unsupported) return absl::StatusCode::kUnimplemented;
  return absl::StatusCode::kInternal;
}

}  // namespace

absl::Status CudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code = CodeFor(
      err == cudaErrorMemoryAllocation,
      err == cudaErrorInvalidValue || err == cudaErrorInvalidDevice ||
          err == cudaErrorInvalidResourceHandle || err == cudaErrorInvalidDevicePointer,
      err == cudaErrorNotSupported || err == cudaErrorCallRequiresNewerDriver);
  return absl::Status(code, absl::StrCat(call, " failed: ", cudaGetErrorName(err), " (",
                                         cudaGetErrorString(err), ")"));
}

absl::Status CuStatus(CUresult err, const char* call) {
  if (err == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "unknown driver error";
  if (auto api = DriverApi::Get(); api.ok()) {
    (*api)->cuGetErrorName(err, &name);
    (*api)->cuGetErrorString(err, &text);
  }
  const absl::StatusCode code =
      CodeFor(err == CUDA_ERROR_OUT_OF_MEMORY,
              err == CUDA_ERROR_INVALID_VALUE || err == CUDA_ERROR_INVALID_DEVICE ||
                  err == CUDA_ERROR_INVALID_HANDLE,
              err == CUDA_ERROR_NOT_SUPPORTED || err == CUDA_ERROR_NOT_PERMITTED);
  return absl::Status(code, absl::StrCat(call, " failed: ", name, " (", text, ")"));
}

}  // namespace cma
