#include "backends/cuda/cuda_shmem.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/nvshmem_api.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

cudaStream_t AsStream(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

// `device` current for the scope (none when negative), the caller's restored.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (device < 0 || cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) {
      previous_ = -1;
      return;
    }
    status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<Backend::ShmemState> CudaShmem::QueryState() {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  Backend::ShmemState s;
  if ((*api)->init_status() >= nvshmem_abi::kStatusIsInitialized) {
    s = {true, (*api)->my_pe(), (*api)->n_pes()};
  }
  return s;
}

absl::StatusOr<std::string> CudaShmem::UniqueId() {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  nvshmem_abi::UniqueId id;
  std::memset(&id, 0, sizeof(id));
  id.version = nvshmem_abi::Version(sizeof(id));  // NVSHMEMX_UNIQUEID_INITIALIZER
  if (int rc = (*api)->get_uniqueid(&id); rc != 0) {
    return absl::InternalError(absl::StrCat("nvshmemx_get_uniqueid returned ", rc));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::Status CudaShmem::Init(const std::string& unique_id, int pe, int n_pes, int device) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  MutexLock l(&mu_);
  if ((*api)->init_status() >= nvshmem_abi::kStatusIsInitialized) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "nvshmemx_hostlib_init_attr: NVSHMEM is initialised already in this process (PE %d of %d)",
        (*api)->my_pe(), (*api)->n_pes()));
  }
  if (unique_id.size() != sizeof(nvshmem_abi::UniqueId) || n_pes < 1 || pe < 0 || pe >= n_pes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NVSHMEM init: PE %d of %d with a unique id of %d bytes (NVSHMEM's is %d)", pe, n_pes,
        unique_id.size(), sizeof(nvshmem_abi::UniqueId)));
  }
  nvshmem_abi::UniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  nvshmem_abi::InitAttr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.version = nvshmem_abi::Version(sizeof(attr));
  attr.args.version = nvshmem_abi::Version(sizeof(attr.args));
  attr.args.uid_args.version = nvshmem_abi::Version(sizeof(attr.args.uid_args));
  attr.args.uid_args.myrank = -1;
  attr.args.uid_args.nranks = -1;
  if (int rc = (*api)->set_attr_uniqueid_args(pe, n_pes, &id, &attr); rc != 0) {
    return absl::InternalError(absl::StrCat("nvshmemx_set_attr_uniqueid_args returned ", rc));
  }
  // NVSHMEM binds the PE to the context current at initialisation: the
  // device's primary context is made current even when the device already
  // is the current one, because a thread that has made no CUDA call yet has
  // no context at all (NVSHMEM's init then fails: seen on an H200 pair with
  // two plain processes, where torch's processes had one).
  ScopedDevice d(device);
  if (!d.status().ok()) return d.status();
  if (absl::Status s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  if (absl::Status s = CudaStatus(cudaFree(nullptr), "cudaFree(nullptr) (context)"); !s.ok()) {
    return s;
  }
  if (int rc = (*api)->hostlib_init_attr(nvshmem_abi::kInitWithUniqueId, &attr); rc != 0) {
    return absl::InternalError(absl::StrFormat(
        "nvshmemx_hostlib_init_attr (PE %d of %d, device %d, %s) returned %d", pe, n_pes, device,
        (*api)->path, rc));
  }
  device_ = device;
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaShmem::Malloc(std::size_t bytes) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  MutexLock l(&mu_);
  ScopedDevice d(device_);
  if (!d.status().ok()) return d.status();
  void* p = (*api)->malloc(bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "nvshmem_malloc(%d) returned null: NVSHMEM's symmetric heap is full (its size is "
        "NVSHMEM_SYMMETRIC_SIZE)",
        bytes));
  }
  return p;
}

absl::Status CudaShmem::Free(void* ptr) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  MutexLock l(&mu_);
  ScopedDevice d(device_);
  if (!d.status().ok()) return d.status();
  (*api)->free(ptr);
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaShmem::PeerPointer(void* ptr, int pe) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  return (*api)->ptr(ptr, pe);
}

// NVSHMEM's on-stream calls return nothing: NVSHMEM reports their failures
// itself (it aborts the process), and asking the runtime for its last error
// would take another call's.
absl::Status CudaShmem::Put(void* dst, const void* src, std::size_t bytes, int pe, Stream stream) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  ScopedDevice d(device_);  // the PE's device, as NVSHMEM's calls expect
  if (!d.status().ok()) return d.status();
  (*api)->putmem_on_stream(dst, src, bytes, pe, AsStream(stream));
  return absl::OkStatus();
}

absl::Status CudaShmem::Get(void* dst, const void* src, std::size_t bytes, int pe, Stream stream) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  ScopedDevice d(device_);  // the PE's device, as NVSHMEM's calls expect
  if (!d.status().ok()) return d.status();
  (*api)->getmem_on_stream(dst, src, bytes, pe, AsStream(stream));
  return absl::OkStatus();
}

absl::Status CudaShmem::Quiet(Stream stream) {
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) return api.status();
  ScopedDevice d(device_);  // the PE's device, as NVSHMEM's calls expect
  if (!d.status().ok()) return d.status();
  (*api)->quiet_on_stream(AsStream(stream));
  return absl::OkStatus();
}

absl::Status CudaPeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  // In the stream's device: a peer's buffer is mapped for that device only
  // (nvshmem_ptr, an imported VMM handle), whatever device is current.
  int device = -1;
  if (stream != kDefaultStream) {
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(AsStream(stream), &device));
  }
  ScopedDevice d(device);
  if (!d.status().ok()) return d.status();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)),
                    "cudaMemcpyAsync (PeerCopy)");
}

}  // namespace cma
