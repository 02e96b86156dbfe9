// CudaBackend's managed memory (cudaMallocManaged), placement (advise,
// prefetch, batch prefetch and discard, range attributes) and stream-ordered
// copies.
#include "backends/cuda/cuda_backend_internal.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace cma {
namespace cuda_internal {

namespace {

#if CUDART_VERSION >= 13000
cudaMemLocation ToCuda(const Location& l) {
  cudaMemLocation loc{};
  loc.type = l.is_host() ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  loc.id = l.is_host() ? 0 : l.device;
  return loc;
}
#else
int ToCuda(const Location& l) { return l.is_host() ? cudaCpuDeviceId : l.device; }
#endif

}  // namespace

// ---- managed memory ----
absl::StatusOr<void*> CudaBackend::AllocateManaged(int device, std::size_t bytes) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  DeviceGuard g(device);
  CMA_RETURN_IF_ERROR(g.status());
  void* p = nullptr;
  RelaxedCaptureMode relaxed;
  CMA_CUDA_RETURN_IF_ERROR(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal));
  return p;
}

absl::Status CudaBackend::FreeManaged(void* ptr) {
  CMA_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
  return absl::OkStatus();
}

// ---- placement ----
absl::Status CudaBackend::Advise(void* ptr, std::size_t bytes, Advice advice, Location location) {
  cudaMemoryAdvise a;
  switch (advice) {
    case Advice::kSetReadMostly: a = cudaMemAdviseSetReadMostly; break;
    case Advice::kUnsetReadMostly: a = cudaMemAdviseUnsetReadMostly; break;
    case Advice::kSetPreferredLocation: a = cudaMemAdviseSetPreferredLocation; break;
    case Advice::kUnsetPreferredLocation: a = cudaMemAdviseUnsetPreferredLocation; break;
    case Advice::kSetAccessedBy: a = cudaMemAdviseSetAccessedBy; break;
    case Advice::kUnsetAccessedBy: a = cudaMemAdviseUnsetAccessedBy; break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("cudaMemAdvise: advice ", AdviceName(advice), " exists only on HIP"));
  }
  CMA_CUDA_RETURN_IF_ERROR(cudaMemAdvise(ptr, bytes, a, ToCuda(location)));
  return absl::OkStatus();
}

absl::Status CudaBackend::Prefetch(void* ptr, std::size_t bytes, Location location, Stream stream) {
#if CUDART_VERSION >= 13000
  CMA_CUDA_RETURN_IF_ERROR(
      cudaMemPrefetchAsync(ptr, bytes, ToCuda(location), 0, AsStream(stream)));
#else
  CMA_CUDA_RETURN_IF_ERROR(cudaMemPrefetchAsync(ptr, bytes, ToCuda(location), AsStream(stream)));
#endif
  return absl::OkStatus();
}

absl::Status CudaBackend::PrefetchBatch(absl::Span<const Range> ranges, Location location,
                                        Stream stream) {
  if (ranges.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 13000
  if (ranges.size() > 1) {
    return Ordered(stream, [&](cudaStream_t s) {
      Batch b(ranges);
      cudaMemLocation loc = ToCuda(location);
      std::size_t first = 0;
      return CudaStatus(cudaMemPrefetchBatchAsync(b.ptrs.data(), b.sizes.data(), b.ptrs.size(),
                                                  &loc, &first, 1, 0, s),
                        "cudaMemPrefetchBatchAsync");
    });
  }
#endif
  for (const Range& r : ranges) CMA_RETURN_IF_ERROR(Prefetch(r.ptr, r.bytes, location, stream));
  return absl::OkStatus();
}

absl::Status CudaBackend::DiscardBatch(absl::Span<const Range> ranges, Stream stream) {
  if (ranges.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 13000
  return Ordered(stream, [&](cudaStream_t s) {
    Batch b(ranges);
    return CudaStatus(cudaMemDiscardBatchAsync(b.ptrs.data(), b.sizes.data(), b.ptrs.size(), 0, s),
                      "cudaMemDiscardBatchAsync");
  });
#else
  (void)stream;
  // Before CUDA 13 there is no discard: keeping the contents is a valid
  // outcome of "contents are dead", only slower on the next migration.
  return absl::OkStatus();
#endif
}

absl::Status CudaBackend::DiscardAndPrefetchBatch(absl::Span<const Range> ranges, Location location,
                                                  Stream stream) {
  if (ranges.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 13000
  return Ordered(stream, [&](cudaStream_t s) {
    Batch b(ranges);
    cudaMemLocation loc = ToCuda(location);
    std::size_t first = 0;
    return CudaStatus(cudaMemDiscardAndPrefetchBatchAsync(b.ptrs.data(), b.sizes.data(),
                                                          b.ptrs.size(), &loc, &first, 1, 0, s),
                      "cudaMemDiscardAndPrefetchBatchAsync");
  });
#else
  return PrefetchBatch(ranges, location, stream);
#endif
}

absl::StatusOr<RangeAttributes> CudaBackend::GetRangeAttributes(void* ptr, std::size_t bytes) {
  RangeAttributes a;
  int v = 0;
  CMA_CUDA_RETURN_IF_ERROR(
      cudaMemRangeGetAttribute(&v, sizeof(v), cudaMemRangeAttributeReadMostly, ptr, bytes));
  a.read_mostly = v != 0;
#if CUDART_VERSION >= 13000
  int type = 0, id = 0;
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
      &type, sizeof(type), cudaMemRangeAttributePreferredLocationType, ptr, bytes));
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
      &id, sizeof(id), cudaMemRangeAttributePreferredLocationId, ptr, bytes));
  a.has_preferred_location = type == cudaMemLocationTypeDevice || type == cudaMemLocationTypeHost;
  a.preferred_location = type == cudaMemLocationTypeHost ? Location::Host() : Location::Device(id);
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
      &type, sizeof(type), cudaMemRangeAttributeLastPrefetchLocationType, ptr, bytes));
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
      &id, sizeof(id), cudaMemRangeAttributeLastPrefetchLocationId, ptr, bytes));
  a.has_last_prefetch = type == cudaMemLocationTypeDevice || type == cudaMemLocationTypeHost;
  a.last_prefetch_location =
      type == cudaMemLocationTypeHost ? Location::Host() : Location::Device(id);
#else
  int loc = cudaInvalidDeviceId;
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
      &loc, sizeof(loc), cudaMemRangeAttributePreferredLocation, ptr, bytes));
  a.has_preferred_location = loc != cudaInvalidDeviceId;
  a.preferred_location = loc == cudaCpuDeviceId ? Location::Host() : Location::Device(loc);
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
      &loc, sizeof(loc), cudaMemRangeAttributeLastPrefetchLocation, ptr, bytes));
  a.has_last_prefetch = loc != cudaInvalidDeviceId;
  a.last_prefetch_location = loc == cudaCpuDeviceId ? Location::Host() : Location::Device(loc);
#endif
  std::vector<int> by(device_count_ + 1, cudaInvalidDeviceId);
  CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(by.data(), by.size() * sizeof(int),
                                                    cudaMemRangeAttributeAccessedBy, ptr, bytes));
  for (int d : by) {
    if (d >= 0) a.accessed_by.push_back(d);
  }
  return a;
}

absl::Status CudaBackend::CopyBatch(absl::Span<const Copy> copies, Stream stream) {
  for (const Copy& c : copies) {
    CMA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, AsStream(stream)));
  }
  return absl::OkStatus();
}

}  // namespace cuda_internal

}  // namespace cma
