#include "capture_watch.h"

#include <algorithm>

namespace cma_torch {
namespace {

bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusActive;
}

}  // namespace

bool AcceptsStream(const CaptureWatch::Filter& filter, cudaStream_t stream) {
  try {
    return filter(stream);
  } catch (...) {
    return false;
  }
}

bool CapturingOrUnknown(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for PyTorch's next error check
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

void CaptureWatch::Begin(c10::DeviceIndex device, Pool pool, std::shared_ptr<const Filter> filter,
                         cudaStream_t stream) {
  if (filter == nullptr || !*filter) return;  // accepts every stream: no capture's filter
  std::lock_guard<std::mutex> l(mu_);
  entries_.push_back(
      {{device, pool}, std::move(filter), stream, std::this_thread::get_id(), State::kUnknown});
  watched_.store(static_cast<int>(entries_.size()), std::memory_order_relaxed);
}

void CaptureWatch::End(c10::DeviceIndex device, Pool pool) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->context.device == device && it->context.pool == pool) {
      entries_.erase(std::next(it).base());
      break;
    }
  }
  watched_.store(static_cast<int>(entries_.size()), std::memory_order_relaxed);
}

std::vector<CaptureWatch::Context> CaptureWatch::TakeFailed() {
  std::vector<Context> failed;
  std::lock_guard<std::mutex> l(mu_);
  const std::thread::id self = std::this_thread::get_id();
  for (auto it = entries_.begin(); it != entries_.end();) {
    bool drop = false;
    if (it->thread == self) {
      if (AcceptsStream(*it->filter, it->stream)) {
        if (it->state == State::kUnknown) {
          // Accepted while capturing: a capture's context. Accepted with no
          // capture there: a stream or thread context, not watched further.
          if (Capturing(it->stream)) {
            it->state = State::kCapturing;
          } else {
            drop = true;
          }
        }
      } else if (it->state == State::kCapturing) {
        failed.push_back(it->context);
        drop = true;
      }
    }
    it = drop ? entries_.erase(it) : std::next(it);
  }
  watched_.store(static_cast<int>(entries_.size()), std::memory_order_relaxed);
  return failed;
}

}  // namespace cma_torch
