// CudaBackend's streams, events, host functions and the capture graph's
// topology (cuda_capture.h).
#include "backends/cuda/cuda_backend_internal.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "backends/cuda/cuda_capture.h"
#include "backends/host_function.h"

namespace cma {
namespace cuda_internal {

// ---- streams and events ----
absl::StatusOr<Stream> CudaBackend::CreateStream(int device) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  DeviceGuard g(device);
  CMA_RETURN_IF_ERROR(g.status());
  cudaStream_t s;
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return reinterpret_cast<Stream>(s);
}

absl::Status CudaBackend::DestroyStream(Stream stream) {
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError("DestroyStream: the default stream cannot be destroyed");
  }
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(AsStream(stream)));
  return absl::OkStatus();
}

absl::Status CudaBackend::ValidateStream(int device, Stream stream) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  if (stream == kDefaultStream) return absl::OkStatus();
  // A stream first seen while it captures (PyTorch's side streams joined
  // to a graph): cudaStreamGetDevice is refused on it, in any capture
  // mode, and the refusal invalidates the capture. Asking whether it
  // captures is allowed and proves the handle is a live stream; its device
  // goes unchecked then (PyTorch hands only the current device's streams).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(AsStream(stream), &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return absl::OkStatus();
  int owner = -1;
  RelaxedCaptureMode relaxed;  // another thread's global capture forbids it too
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(AsStream(stream), &owner));
  if (owner != device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream %p belongs to device %d, not device %d", AsStream(stream), owner, device));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::SynchronizeStream(Stream stream) {
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream)));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::QueryStream(Stream stream) {
  const cudaError_t err = cudaStreamQuery(AsStream(stream));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return CudaStatus(err, "cudaStreamQuery");
}

absl::Status CudaBackend::LaunchHostFunction(Stream stream, HostFunction fn) {
  void* data = NewHostFunction(std::move(fn));
  const cudaError_t err = cudaLaunchHostFunc(AsStream(stream), RunHostFunction, data);
  if (err != cudaSuccess) {
    DropHostFunction(data);
    return CudaStatus(err, "cudaLaunchHostFunc");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::IsCapturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(AsStream(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

// Graph topology for reuse inside a capture (backends/cuda/cuda_capture.h).
absl::StatusOr<std::optional<CaptureFrontier>> CudaBackend::CaptureFrontierOf(Stream stream) {
  return CudaCaptureFrontier(AsStream(stream));
}

absl::StatusOr<std::vector<CaptureNode>> CudaBackend::CaptureNodeDependencies(CaptureNode node) {
  return CudaCaptureNodeDependencies(node);
}

absl::StatusOr<Event> CudaBackend::CreateEvent(int device) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  DeviceGuard g(device);
  CMA_RETURN_IF_ERROR(g.status());
  cudaEvent_t e;
  CMA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return reinterpret_cast<Event>(e);
}

absl::Status CudaBackend::DestroyEvent(Event event) {
  CMA_CUDA_RETURN_IF_ERROR(cudaEventDestroy(AsEvent(event)));
  return absl::OkStatus();
}

absl::Status CudaBackend::RecordEvent(Event event, Stream stream) {
  CMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(AsEvent(event), AsStream(stream)));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::QueryEvent(Event event) {
  const cudaError_t err = cudaEventQuery(AsEvent(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return CudaStatus(err, "cudaEventQuery");
}

absl::Status CudaBackend::SynchronizeEvent(Event event) {
  CMA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(AsEvent(event)));
  return absl::OkStatus();
}

absl::Status CudaBackend::StreamWaitEvent(Stream stream, Event event) {
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0));
  return absl::OkStatus();
}

}  // namespace cuda_internal

}  // namespace cma
