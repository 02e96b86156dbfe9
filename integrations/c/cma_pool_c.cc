// The C ABI's pool queries and checkpoints (cma_c.h): use counts, a pool's
// empty_cache, and the checkpoint/restore of torch.compile's cudagraph trees.
#include <cstddef>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/caching_managed_allocator.h"
#include "integrations/c/cma_c.h"
#include "integrations/c/cma_c_internal.h"

struct cma_pool_checkpoint {
  cma::PoolCheckpoint state;
};

namespace {

// A cma_segment_source as the core's SegmentSource; releases the caller's
// context when the last reference (the pool's or a segment's) goes.
class CallbackSource final : public cma::SegmentSource {
 public:
  explicit CallbackSource(const cma_segment_source& s) : s_(s) {}
  ~CallbackSource() override {
    if (s_.release_ctx != nullptr) s_.release_ctx(s_.ctx);
  }
  absl::StatusOr<void*> Allocate(int device, std::size_t bytes, cma::Stream stream) override {
    void* p = s_.alloc(s_.ctx, device, bytes, reinterpret_cast<void*>(stream));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the pool's own allocator returned no memory for a segment of ", bytes, " bytes"));
    }
    return p;
  }
  absl::Status Free(int device, void* ptr, std::size_t bytes) override {
    if (s_.free(s_.ctx, device, ptr, bytes) == 0) return absl::OkStatus();
    return absl::InternalError("the pool's own allocator did not take its memory back");
  }

 private:
  const cma_segment_source s_;
};

}  // namespace

using cma::CachingManagedAllocator;
using cma::capi::Fail;
using cma::capi::Get;

using cma::capi::WithAllocator;

extern "C" {

int cma_pool_create_with_source(int device, unsigned long long id0, unsigned long long id1,
                                const cma_segment_source* source) {
  if (source == nullptr) {
    return Fail(absl::InvalidArgumentError("cma_pool_create_with_source: null source"));
  }
  // From here the context is owned: released on every path.
  auto owned = std::make_shared<CallbackSource>(*source);
  if (source->alloc == nullptr || source->free == nullptr) {
    return Fail(absl::InvalidArgumentError(
        "cma_pool_create_with_source: the source needs both alloc and free"));
  }
  return WithAllocator([&](CachingManagedAllocator& a) {
    return a.CreatePoolWithSource(device, {id0, id1}, std::move(owned));
  });
}

int cma_pool_use_count(int device, unsigned long long id0, unsigned long long id1) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<int> n = a->GetPoolUseCount(device, {id0, id1});
  return n.ok() ? *n : Fail(n.status());
}

int cma_pool_set_options(int device, unsigned long long id0, unsigned long long id1, int no_split,
                         int use_on_oom) {
  return WithAllocator([&](CachingManagedAllocator& a) -> absl::Status {
    for (int flag : {no_split, use_on_oom}) {
      if (flag < -1 || flag > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cma_pool_set_options: flags are 0, 1 or -1 (keep), not ", flag));
      }
    }
    absl::StatusOr<cma::PoolOptions> o = a.GetPoolOptions(device, {id0, id1});
    if (!o.ok()) return o.status();
    if (no_split >= 0) o->no_split = no_split == 1;
    if (use_on_oom >= 0) o->use_on_oom = use_on_oom == 1;
    return a.SetPoolOptions(device, {id0, id1}, *o);
  });
}

int cma_pool_empty_cache(int device, unsigned long long id0, unsigned long long id1) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.EmptyPoolCache(device, {id0, id1}); });
}

cma_pool_checkpoint* cma_pool_checkpoint_take(int device, unsigned long long id0,
                                              unsigned long long id1) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  absl::StatusOr<cma::PoolCheckpoint> cp = a->TakePoolCheckpoint(device, {id0, id1});
  if (!cp.ok()) {
    Fail(cp.status());
    return nullptr;
  }
  return new cma_pool_checkpoint{std::move(*cp)};
}

void cma_pool_checkpoint_free(cma_pool_checkpoint* cp) { delete cp; }

int cma_pool_checkpoint_restore(const cma_pool_checkpoint* cp, cma_pool_ptr_fn on_freed,
                                cma_pool_ptr_fn on_created, void* ctx) {
  if (cp == nullptr) {
    return Fail(absl::InvalidArgumentError("cma_pool_checkpoint_restore: null checkpoint"));
  }
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<cma::PoolRestoreResult> r = a->RestorePoolCheckpoint(cp->state);
  if (!r.ok()) return Fail(r.status());
  // The allocation history sees what moved: not the allocations kept in place.
  const absl::flat_hash_set<void*> kept_set(r->kept.begin(), r->kept.end());
  const auto kept = [&](void* p) { return kept_set.contains(p); };
  for (const cma::PoolAllocation& f : r->freed) {
    if (!kept(f.ptr)) cma::capi::RecordFree(f.ptr);
  }
  for (const cma::PoolAllocation& c : r->created) {
    if (!kept(c.ptr)) {
      cma::capi::RecordAlloc(c.ptr, c.requested, cp->state.device,
                             reinterpret_cast<void*>(c.stream));
    }
  }
  // The allocator's locks are released: the callbacks may call back into cma.
  if (on_freed != nullptr) {
    for (const cma::PoolAllocation& f : r->freed) on_freed(ctx, f.ptr, f.requested);
  }
  if (on_created != nullptr) {
    for (const cma::PoolAllocation& c : r->created) on_created(ctx, c.ptr, c.requested);
  }
  return 0;
}

}  // extern "C"
