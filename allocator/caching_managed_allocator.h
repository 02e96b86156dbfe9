// CachingManagedAllocator: a stream-aware caching allocator over managed
// (unified) memory, one pool state per device.
//
//   auto backend = cma::MakeBackend("best");                 // cuda, hip or host
//   auto alloc = cma::CachingManagedAllocator::Create(*backend, "max_split_size_mb:256");
//   void* p = (*alloc)->Allocate(1 << 20, /*device=*/0, stream).value();
//   (*alloc)->RecordStream(p, other_stream);   // p is also used on other_stream
//   (*alloc)->Free(p);
//
// Reuse follows stream order, as in PyTorch: a block freed on stream S is
// reusable at once by S, and by another stream only once the work queued on
// S and on every stream named by RecordStream has completed.
//
// Thread safety: every method may be called concurrently; each device has its
// own lock. Ownership: the backend must outlive the allocator; the allocator
// returns all its memory to the backend when destroyed (pointers still handed
// out become invalid). Errors: bad input (size 0 or larger than the device,
// invalid device or stream, a foreign pointer, a double free) returns
// kInvalidArgument naming the problem and changes nothing; out of memory
// returns kResourceExhausted with the allocator's statistics in the message,
// after one retry that waits for pending frees and releases the cache.
#ifndef CMA_ALLOCATOR_CACHING_MANAGED_ALLOCATOR_H_
#define CMA_ALLOCATOR_CACHING_MANAGED_ALLOCATOR_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/device_allocator.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"
#include "backends/backend.h"
#include "policy/config.h"

namespace cma {

class CachingManagedAllocator {
 public:
  static absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> Create(Backend& backend,
                                                                         AllocatorConfig config);
  // Parses `config` as CMA_ALLOC_CONF text first.
  static absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> Create(Backend& backend,
                                                                         absl::string_view config);

  absl::StatusOr<void*> Allocate(std::size_t bytes, int device, Stream stream = kDefaultStream);
  absl::Status Free(void* ptr);
  absl::Status RecordStream(void* ptr, Stream stream);
  // Returns every fully-free cached segment of every device to the backend.
  absl::Status EmptyCache();

  // The device that owns `ptr` (a pointer returned by Allocate and not freed).
  absl::StatusOr<int> DeviceOf(void* ptr);

  int device_count() const { return static_cast<int>(devices_.size()); }
  const AllocatorConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }

  absl::StatusOr<DeviceStats> GetStats(int device);
  DeviceStats GetStats();  // summed over devices
  absl::Status ResetPeakStats(int device);
  absl::Status ResetAccumulatedStats(int device);
  std::vector<SegmentSnapshot> Snapshot();
  // The invariant checker (see DeviceAllocator::CheckInvariants) on every device.
  absl::Status CheckInvariants();

 private:
  CachingManagedAllocator(Backend& backend, AllocatorConfig config)
      : backend_(backend), config_(std::move(config)) {}
  absl::StatusOr<DeviceAllocator*> Device(int device);
  absl::Status BadDevice(int device) const;

  Backend& backend_;
  const AllocatorConfig config_;
  std::vector<std::unique_ptr<DeviceAllocator>> devices_;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_CACHING_MANAGED_ALLOCATOR_H_
