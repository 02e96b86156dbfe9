// DeviceAllocator's sleep mode: Sleep, Wake, and the pinned host staging
// (allocator/staging.h) through which kept contents leave the device at
// the copy engine's speed and come back the same way.
#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// Staging grows by chunks of at most this much, each put to work (its
// copies queued) before the next is pinned: a first Sleep's copies overlap
// the pinning of the rest.
constexpr std::size_t kStagingChunk = std::size_t{256} << 20;

std::size_t TotalBytes(absl::Span<const Range> ranges) {
  std::size_t n = 0;
  for (const Range& r : ranges) n += r.bytes;
  return n;
}

}  // namespace

absl::Status DeviceAllocator::SetKeep(void* ptr, bool keep) {
  MutexLock l(&mu_);
  auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocated_.end()) return NotMine();
  it->second->keep = keep;
  return absl::OkStatus();
}

void DeviceAllocator::Unstage(std::uintptr_t addr) {
  if (staged_.erase(addr) != 0 && staged_.empty()) staging_.Reset();
}

std::vector<Range> DeviceAllocator::StageOut(const std::vector<Range>& whole,
                                             const std::vector<Block*>& owners, Stream stream,
                                             std::vector<Range>* migrate) {
  // Offsets first, within the configured bound; what does not fit migrates.
  const std::size_t bound = config_->sleep_staging_max;
  std::vector<std::size_t> offset(whole.size());
  std::vector<std::size_t> planned;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    if (whole[i].bytes > bound - std::min(bound, staging_.used())) {
      migrate->push_back(whole[i]);
      continue;
    }
    offset[i] = staging_.Take(whole[i].bytes);
    planned.push_back(i);
  }
  std::vector<Range> staged;
  std::vector<Copy> copies;
  std::vector<std::size_t> batch;  // the planned blocks whose copies are in `copies`
  // Queues the copies gathered so far; on failure their blocks migrate.
  auto flush = [&]() {
    if (copies.empty()) return;
    if (backend_->CopyBatch(copies, stream).ok()) {
      for (std::size_t i : batch) {
        staged_[owners[i]->addr] = {offset[i], whole[i]};
        staged.push_back(whole[i]);
        stats_.sleep_staged_bytes += static_cast<std::int64_t>(whole[i].bytes);
      }
    } else {
      ++stats_.num_placement_errors;
      for (std::size_t i : batch) migrate->push_back(whole[i]);
    }
    copies.clear();
    batch.clear();
  };
  for (std::size_t k = 0; k < planned.size(); ++k) {
    const std::size_t i = planned[k];
    bool room = true;
    while (offset[i] + whole[i].bytes > staging_.capacity()) {
      flush();  // the copy engine starts on what has room while we pin more
      const std::size_t want = std::min(kStagingChunk, staging_.used() - staging_.capacity());
      if (!staging_.Grow(*backend_, (want + kPageSize - 1) / kPageSize * kPageSize).ok()) {
        room = false;
        break;
      }
      stats_.host_staging_bytes[kAllPools].Add(
          static_cast<std::int64_t>((want + kPageSize - 1) / kPageSize * kPageSize));
    }
    if (!room) {
      // No more pinned memory (or none at all on this backend): the rest
      // migrates, and the offsets it had are given back.
      std::size_t rest = 0;
      for (std::size_t j = k; j < planned.size(); ++j) {
        migrate->push_back(whole[planned[j]]);
        rest += whole[planned[j]].bytes;
      }
      staging_.Untake(rest);
      break;
    }
    staging_.AppendCopies(offset[i], whole[i].ptr, whole[i].bytes, /*to_staging=*/true, &copies);
    batch.push_back(i);
  }
  flush();
  return staged;
}

absl::StatusOr<std::size_t> DeviceAllocator::Sleep(Stream stream, SleepLevel level) {
  if (level != SleepLevel::kMigrate && level != SleepLevel::kOffload &&
      level != SleepLevel::kDiscard) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: sleep level %d (0: migrate, 1: offload, 2: discard)", static_cast<int>(level)));
  }
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("sleep"); !s.ok()) return s;
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  // The contract: Sleep is ordered after the work already queued on every
  // stream that uses an allocation (its own and those named by
  // RecordStream), so no kernel still running there sees its data copied,
  // moved or discarded. `stream` waits for each of them on the GPU; no
  // host sync.
  absl::flat_hash_set<Stream> users;
  for (auto& [addr, b] : allocated_) {
    if (b->stream != stream) users.insert(b->stream);
    for (Stream u : b->stream_uses) {
      if (u != stream) users.insert(u);
    }
  }
  // And after the last Wake, whose repopulation these discards must follow,
  // and after every read of the staging these copies overwrite.
  users.insert(sleep_wake_stream_);
  users.insert(staging_readers_.begin(), staging_readers_.end());
  users.erase(stream);
  for (Stream u : users) {
    // Unordered, the discard below could run before a kernel's last use.
    if (absl::Status w = OrderAfter(stream, u); !w.ok()) {
      return absl::Status(w.code(), absl::StrCat("cma: sleep could not order after a stream "
                                                 "that uses an allocation: ", w.message()));
    }
  }
  staging_readers_.clear();
  // Kept blocks' whole pages are staged (copied out, then discarded); their
  // partial edge pages, which may hold neighbours' data, migrate, as does
  // all of a block that stays where it is (already on the host) or when
  // staging is off. Discarded blocks lose their whole pages only.
  std::vector<Range> migrate, drop, stage;
  std::vector<Block*> stage_owners;
  std::size_t bytes = 0;
  std::size_t kept = 0;
  std::vector<Block*> blocks;
  blocks.reserve(allocated_.size());
  for (auto& [addr, b] : allocated_) blocks.push_back(b);
  // Address order: the same state stages the same way every cycle.
  std::sort(blocks.begin(), blocks.end(), [](const Block* a, const Block* b) {
    return a->addr < b->addr;
  });
  for (Block* b : blocks) {
    bytes += b->size;
    if (staged_.contains(b->addr)) continue;  // staged by an earlier Sleep, still away
    const Range r{b->ptr(), b->size};
    if (b->disposable || (level == SleepLevel::kDiscard && !b->keep)) {
      SplitAtPages(r, &drop, &migrate);
      continue;
    }
    ++kept;
    if (level == SleepLevel::kMigrate || config_->sleep_staging_max == 0 ||
        (b->placed && b->location.is_host())) {
      migrate.push_back(r);
      continue;
    }
    const std::size_t n = stage.size();
    SplitAtPages(r, &stage, &migrate);
    if (stage.size() > n) stage_owners.push_back(b);
  }
  const std::vector<Range> staged = StageOut(stage, stage_owners, stream, &migrate);
  absl::Status s = Execute(PlacementAction::kPrefetch, migrate, Location::Host(), stream);
  std::vector<Range> discard = drop;
  discard.insert(discard.end(), staged.begin(), staged.end());
  if (s.ok() && !discard.empty()) {
    // After the copies out, in stream order: the pages' contents are in
    // the staging by the time they go.
    s = backend_->DiscardBatch(discard, stream);
    if (s.ok()) {
      ++stats_.discard_calls;
      stats_.discarded_bytes += static_cast<std::int64_t>(TotalBytes(discard));
    }
  }
  if (!s.ok()) {
    // The allocations stay as they were (a failed call discards nothing):
    // their pages hold their contents and the user may go on writing them,
    // so what this call staged is forgotten; kept, a Move or the next
    // cycle's Wake would copy that stale image back over newer writes.
    for (Block* b : stage_owners) Unstage(b->addr);
    sleep_wake_stream_ = stream;
    return absl::Status(s.code(), absl::StrCat("cma: sleep failed: ", s.message()));
  }
  for (Block* b : blocks) {
    // A discarded block counts as away too: whoever reuses it after its
    // free brings its pages back to the device.
    const bool discarded = b->disposable || (level == SleepLevel::kDiscard && !b->keep);
    b->pages_discarded = b->pages_discarded || discarded || staged_.contains(b->addr);
    b->placed = true;
    b->location = Location::Host();
  }
  sleep_wake_stream_ = stream;
  stats_.moves += static_cast<std::int64_t>(kept);
  // The cache sleeps too: idle memory goes back (arena pages by discard,
  // stream-ordered), so the device holds nothing of this allocator's.
  ProcessPendingFrees(/*synchronize=*/false);
  CoalesceUnmerged();
  ReleaseCachedSegments(0);
  return bytes;
}

absl::Status DeviceAllocator::RestoreStaged(absl::Span<Block* const> blocks, Location target,
                                            Stream stream, bool contents_dead) {
  std::vector<Range> pages;
  std::vector<Copy> copies;
  std::vector<Block*> mine;
  for (Block* b : blocks) {
    auto it = staged_.find(b->addr);
    if (it == staged_.end()) continue;
    mine.push_back(b);
    if (contents_dead) continue;
    pages.push_back(it->second.pages);
    staging_.AppendCopies(it->second.offset, it->second.pages.ptr, it->second.pages.bytes,
                          /*to_staging=*/false, &copies);
  }
  if (mine.empty()) return absl::OkStatus();
  if (!contents_dead) {
    // After the Sleep's copies out and discards; the pages are populated
    // at the target (nothing to migrate: they hold nothing) and written.
    if (absl::Status w = OrderAfter(stream, sleep_wake_stream_); !w.ok()) return w;
    if (absl::Status s = Execute(PlacementAction::kDiscardAndPrefetch, pages, target, stream);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = backend_->CopyBatch(copies, stream); !s.ok()) return s;
    stats_.sleep_restored_bytes += static_cast<std::int64_t>(TotalBytes(pages));
    if (stream != sleep_wake_stream_) staging_readers_.insert(stream);
  }
  for (Block* b : mine) {
    Unstage(b->addr);
    if (!contents_dead) b->pages_discarded = false;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> DeviceAllocator::Wake(Stream stream) {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("wake"); !s.ok()) return s;
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  // Ordered after the Sleep, whichever stream each was given.
  if (absl::Status w = OrderAfter(stream, sleep_wake_stream_); !w.ok()) {
    return absl::Status(w.code(), absl::StrCat("cma: wake could not order after the sleep: ",
                                               w.message()));
  }
  const Location here = Location::Device(device_);
  std::vector<Range> migrate, repopulate;
  std::vector<Copy> copies;
  std::size_t bytes = 0, restored = 0;
  for (auto& [addr, b] : allocated_) {
    if (b->placed && b->location == here) continue;
    bytes += b->size;
    const Range r{b->ptr(), b->size};
    auto st = staged_.find(addr);
    if (st != staged_.end()) {
      // Its whole pages are populated here and copied back into; the
      // partial ones at its ends migrate with the rest.
      std::vector<Range> whole;
      SplitAtPages(r, &whole, &migrate);
      repopulate.push_back(st->second.pages);
      staging_.AppendCopies(st->second.offset, st->second.pages.ptr, st->second.pages.bytes,
                            /*to_staging=*/false, &copies);
      restored += st->second.pages.bytes;
    } else if (b->disposable) {
      // (A block a level-2 Sleep discarded migrates: a prefetch populates
      // pages that hold nothing, and keeps what a Move since put there.)
      SplitAtPages(r, &repopulate, &migrate);
    } else {
      migrate.push_back(r);
    }
  }
  // A block's stream may have a discard of its pages still queued (the
  // cache's idle pages released by the Sleep): the wake waits for those
  // streams too before it populates.
  absl::flat_hash_set<Stream> owners;
  for (auto& [addr, b] : allocated_) {
    if (!(b->placed && b->location == here) && b->stream != stream) owners.insert(b->stream);
  }
  for (Stream u : owners) {
    if (absl::Status w = OrderAfter(stream, u); !w.ok()) {
      return absl::Status(w.code(), absl::StrCat("cma: wake could not order after a stream "
                                                 "that owns an allocation: ", w.message()));
    }
  }
  absl::Status s = Execute(PlacementAction::kPrefetch, migrate, here, stream);
  if (s.ok()) s = Execute(PlacementAction::kDiscardAndPrefetch, repopulate, here, stream);
  // The copies back follow the population of their pages in stream order.
  if (s.ok() && !copies.empty()) s = backend_->CopyBatch(copies, stream);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("cma: wake failed: ", s.message()));
  stats_.sleep_restored_bytes += static_cast<std::int64_t>(restored);
  staged_.clear();
  staging_.Reset();
  std::size_t woken = 0;
  for (auto& [addr, b] : allocated_) {
    woken += !(b->placed && b->location == here);
    b->placed = true;
    b->location = here;
    b->pages_discarded = false;
  }
  sleep_wake_stream_ = stream;
  stats_.moves += static_cast<std::int64_t>(woken);
  // Work queued later on any stream that uses an allocation runs after the
  // wake: it sees its data in place without a host sync.
  absl::flat_hash_set<Stream> users;
  for (auto& [addr, b] : allocated_) {
    users.insert(b->stream);
    users.insert(b->stream_uses.begin(), b->stream_uses.end());
  }
  users.erase(stream);
  for (Stream u : users) {
    // The placement is done and recorded; the error says what is unordered.
    if (absl::Status w = OrderAfter(u, stream); !w.ok()) {
      return absl::Status(w.code(), absl::StrCat("cma: wake could not order a stream that uses "
                                                 "an allocation after it: ", w.message()));
    }
  }
  return bytes;
}

absl::StatusOr<std::size_t> DeviceAllocator::ReleaseSleepStaging() {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("release_sleep_staging"); !s.ok()) return s;
  if (!staged_.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: device %d's sleep staging holds the contents of %d allocations (asleep): wake "
        "them first", device_, staged_.size()));
  }
  const std::size_t held = staging_.capacity();
  if (held == 0) return 0;
  // The copies out of it (the last Wake's, a Move's) finish first.
  staging_readers_.insert(sleep_wake_stream_);
  for (Stream s : staging_readers_) {
    if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) {
      return absl::Status(w.code(), absl::StrCat("cma: release_sleep_staging could not wait "
                                                 "for the copies out of it: ", w.message()));
    }
  }
  staging_readers_.clear();
  absl::Status s = staging_.Release(*backend_);
  stats_.host_staging_bytes[kAllPools].Sub(
      static_cast<std::int64_t>(held - staging_.capacity()));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cma: release_sleep_staging: ", s.message()));
  }
  return held;
}

}  // namespace cma
