// HostPool's frees: ordering a block's reuse after the GPU's work, pending
// frees, frees during a pool context, and forgetting a stream.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"  // NotMine()
#include "allocator/host_pool.h"
#include "backends/mutex_lock.h"

namespace cma {

absl::Status HostPool::Free(void* ptr) {
  MutexLock l(&mu_);
  Block* b = Find(ptr);
  if (b == nullptr) return NotMine();
  if (!b->allocated) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: double free of host allocation %p (%s)", ptr,
        b->pending ? "its free is waiting for a GPU's work" : "already free"));
  }
  const bool gpu_used = !b->uses.empty() || !b->location.is_host();
  if (!gpu_used) {  // the CPU was its only user
    Release(b);
    MakeFree(b);
    return absl::OkStatus();
  }
  Pending p{b, {}, std::nullopt, /*deferred=*/false};
  if (Quiet()) {
    // No stream call now (a capture may be under way): the ordering waits
    // for the pool context's end, and the block for it.
    p.deferred = true;
  } else if (absl::Status s = OrderReuse(b, &p); !s.ok()) {
    return s;
  }
  Release(b);
  b->pending = true;
  pending_.push_back(std::move(p));
  stats_.pending_frees = static_cast<std::int64_t>(pending_.size());
  return absl::OkStatus();
}

void HostPool::Release(Block* b) {
  // Still where it is until OrderReuse sends it home (later, for a free
  // deferred by a pool context), but no longer a live block on a device.
  if (!b->location.is_host()) {
    stats_.device_resident_bytes.Sub(static_cast<std::int64_t>(b->size));
  }
  b->hints.reset();  // the advice in force stays until someone wants other
  b->allocated = false;
  stats_.allocation.Sub(1);
  stats_.allocated_bytes.Sub(static_cast<std::int64_t>(b->size));
  stats_.requested_bytes.Sub(static_cast<std::int64_t>(b->requested));
  b->requested = 0;
}

absl::Status HostPool::OrderReuse(Block* b, Pending* p) {
  const bool on_device = !b->location.is_host();
  // The last move's stream gets its event after the pages' trip home; made
  // first so that a failure to make it changes nothing.
  std::optional<Event> last;
  if (on_device) {
    if (absl::StatusOr<Event> ev = backend_->CreateEvent(b->last_device); ev.ok()) last = *ev;
  }
  for (const auto& [stream, device] : b->uses) {
    if (on_device && stream == b->last_stream) continue;
    absl::StatusOr<Event> ev = backend_->CreateEvent(device);
    if (ev.ok() && backend_->RecordEvent(*ev, stream).ok()) {
      p->events.push_back(*ev);
      continue;
    }
    if (ev.ok()) (void)backend_->DestroyEvent(*ev);
    // No event there (a device other than the one guessed): wait for it.
    ++stats_.num_sync_streams;
    if (absl::Status s = backend_->SynchronizeStream(stream); !s.ok()) {
      for (Event e : p->events) (void)backend_->DestroyEvent(e);
      p->events.clear();
      if (last) (void)backend_->DestroyEvent(*last);
      return absl::UnavailableError(absl::StrFormat(
          "cma: free of host allocation %#x: its reuse cannot be ordered after the work of "
          "stream %#x, which used it (%s); it stays allocated",
          b->addr, stream, s.message()));
    }
  }
  if (!on_device) return absl::OkStatus();
  // The next CPU user would fault every page back: send them home now, on
  // the last move's stream once every other use is done, without their dead
  // contents.
  bool after_every_use = true;
  for (Event e : p->events) {
    after_every_use = backend_->StreamWaitEvent(b->last_stream, e).ok() && after_every_use;
  }
  const Range r{reinterpret_cast<void*>(b->addr), b->size};
  if (after_every_use &&
      Place({&r, 1}, Location::Host(), b->last_stream, /*contents_dead=*/true).ok()) {
    stats_.returned_bytes += static_cast<std::int64_t>(b->size);
  } else {
    ++stats_.num_placement_errors;  // the pages stay; the CPU faults them back
  }
  SetResidence(b, Location::Host());
  if (last && backend_->RecordEvent(*last, b->last_stream).ok()) {
    p->events.push_back(*last);
  } else {
    if (last) (void)backend_->DestroyEvent(*last);
    p->stream = b->last_stream;  // reusable once that stream is idle
  }
  return absl::OkStatus();
}

void HostPool::ProcessPending(bool wait) {
  if (Quiet()) return;
  auto done = [&](Pending& p) {
    if (p.deferred) {
      if (!OrderReuse(p.block, &p).ok()) return false;  // tried again later
      p.deferred = false;
    }
    for (auto it = p.events.begin(); it != p.events.end();) {
      const bool fired = wait ? backend_->SynchronizeEvent(*it).ok()
                              : backend_->QueryEvent(*it).value_or(false);
      if (!fired) return false;
      (void)backend_->DestroyEvent(*it);
      it = p.events.erase(it);
    }
    if (p.stream) {
      const bool idle = wait ? backend_->SynchronizeStream(*p.stream).ok()
                             : backend_->QueryStream(*p.stream).value_or(false);
      if (!idle) return false;
      p.stream.reset();
    }
    return true;
  };
  auto keep = std::remove_if(pending_.begin(), pending_.end(), [&](Pending& p) {
    if (!done(p)) return false;
    MakeFree(p.block);
    return true;
  });
  pending_.erase(keep, pending_.end());
  stats_.pending_frees = static_cast<std::int64_t>(pending_.size());
}

absl::Status HostPool::ForgetStream(Stream stream) {
  MutexLock l(&mu_);
  bool used = false;
  for (const auto& [addr, b] : blocks_) {
    for (const auto& u : b->uses) used |= u.first == stream;
    used |= (b->allocated || b->pending) && b->last_stream == stream;
  }
  for (const Pending& p : pending_) used |= p.stream == stream;
  if (!used) return absl::OkStatus();
  if (absl::Status s = backend_->SynchronizeStream(stream); !s.ok()) return s;
  for (auto& [addr, b] : blocks_) {
    auto& uses = b->uses;
    uses.erase(std::remove_if(uses.begin(), uses.end(),
                              [&](const auto& u) { return u.first == stream; }),
               uses.end());
    // A later trip home of its pages goes on the default stream.
    if (b->last_stream == stream) b->last_stream = kDefaultStream;
  }
  for (Pending& p : pending_) {
    if (p.stream == stream) p.stream.reset();
  }
  return absl::OkStatus();
}

}  // namespace cma
