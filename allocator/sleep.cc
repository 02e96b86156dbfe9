// DeviceAllocator's sleep mode: Sleep, Wake, and the pinned host staging
// (allocator/staging.h) through which kept contents leave the device at
// the copy engine's speed and come back the same way.
#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/chunk_pinner.h"
#include "allocator/device_allocator.h"
#include "allocator/sleep_plan.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// Staging grows by chunks of at most this much, each put to work (its
// copies queued) as soon as it is pinned: a first Sleep's copies overlap
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

void DeviceAllocator::StageOut(absl::Span<const StagedBlock> parts, Stream stream,
                               std::vector<Range>* migrate) {
  // Offsets first, in address order (adjacent parts stay adjacent in the
  // staging: one copy), within the configured bound; what does not fit
  // migrates.
  const std::size_t bound = config_->sleep_staging_max;
  std::vector<std::size_t> offset(parts.size());
  std::vector<std::size_t> planned;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].bytes.bytes > bound - std::min(bound, staging_.used())) {
      migrate->push_back(parts[i].bytes);
      continue;
    }
    offset[i] = staging_.Take(parts[i].bytes.bytes);
    planned.push_back(i);
  }
  // Every chunk the plan needs starts pinning now, on several threads; each
  // is put to work as soon as it is ready (allocator/chunk_pinner.h).
  std::vector<std::size_t> sizes;
  for (std::size_t have = staging_.capacity(); have < staging_.used();) {
    const std::size_t want = std::min(kStagingChunk, staging_.used() - have);
    sizes.push_back((want + kPageSize - 1) / kPageSize * kPageSize);
    have += sizes.back();
  }
  ChunkPinner pinner(*backend_, sizes,
                     ChunkPinner::ThreadsFor(sizes.size(), config_->sleep_pin_threads));
  std::vector<Copy> copies;
  std::vector<std::size_t> batch;  // the planned parts whose copies are in `copies`
  // Queues the copies gathered so far; on failure their parts migrate.
  auto flush = [&]() {
    if (copies.empty()) return;
    absl::Status c = backend_->CopyBatch(copies, stream);
    if (c.ok()) {
      for (std::size_t i : batch) {
        staged_[parts[i].block->addr] = {offset[i], parts[i].bytes};
        stats_.sleep_staged_bytes += static_cast<std::int64_t>(parts[i].bytes.bytes);
      }
    } else {
      NotePlacementError(absl::Status(
          c.code(), absl::StrCat("cma: sleep: copies into the pinned staging failed (",
                                 batch.size(), " allocations migrate instead): ", c.message())));
      for (std::size_t i : batch) migrate->push_back(parts[i].bytes);
    }
    copies.clear();
    batch.clear();
  };
  for (std::size_t k = 0; k < planned.size(); ++k) {
    const std::size_t i = planned[k];
    const Range& r = parts[i].bytes;
    bool room = true;
    while (offset[i] + r.bytes > staging_.capacity()) {
      flush();  // the copy engine starts on what has room while more is pinned
      absl::StatusOr<ChunkPinner::Chunk> chunk = pinner.Next();
      if (!chunk.ok()) {
        room = false;
        break;
      }
      staging_.Adopt(chunk->base, chunk->bytes);
      stats_.host_staging_bytes[kAllPools].Add(static_cast<std::int64_t>(chunk->bytes));
    }
    if (!room) {
      // No more pinned memory (or none at all on this backend): the rest
      // migrates, and the offsets it had are given back.
      std::size_t rest = 0;
      for (std::size_t j = k; j < planned.size(); ++j) {
        migrate->push_back(parts[planned[j]].bytes);
        rest += parts[planned[j]].bytes.bytes;
      }
      staging_.Untake(rest);
      break;
    }
    // Adjacent allocations staged back to back: one copy, unless they lie
    // in two segments (two managed ranges).
    const bool same_range = k == 0 || parts[planned[k - 1]].block->segment == parts[i].block->segment;
    staging_.AppendCopies(offset[i], r.ptr, r.bytes, /*to_staging=*/true, &copies, same_range);
    batch.push_back(i);
  }
  flush();
}

absl::StatusOr<std::size_t> DeviceAllocator::Sleep(Stream stream, SleepLevel level) {
  if (level != SleepLevel::kMigrate && level != SleepLevel::kOffload &&
      level != SleepLevel::kDiscard) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: sleep level %d (0: migrate, 1: offload, 2: discard)", static_cast<int>(level)));
  }
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("sleep"); !s.ok()) return s;
  DrainLearnedTransfers();
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  // Away allocations count on the device again and leave as the rest do
  // (their pages on the host: a migration leaves them there).
  (void)CountBackAll();
  // Who leaves how: kept blocks are staged (copied out, then discarded)
  // within the bound; a kept block that stays where it is (already on the
  // host), or every one at level 0 or with staging off, migrates. Their
  // bytes on pages that must stay (allocator/sleep_plan.h) migrate too.
  std::vector<Block*> blocks;
  blocks.reserve(allocated_.size());
  // (The host tier's allocations hold nothing on the device, and another
  // allocator's memory is not managed: they stay.)
  for (auto& [addr, b] : allocated_) {
    if (b->segment->placeable()) blocks.push_back(b);
  }
  // Address order: the same state stages the same way every cycle.
  std::sort(blocks.begin(), blocks.end(), [](const Block* a, const Block* b) {
    return a->addr < b->addr;
  });
  LeaveRoles roles;
  std::vector<Range> migrate;
  std::size_t bytes = 0, kept = 0, planned = 0;
  const std::size_t bound = config_->sleep_staging_max;
  for (Block* b : blocks) {
    bytes += b->size;
    if (staged_.contains(b->addr)) continue;  // staged by an earlier Sleep, still away
    if (b->disposable || (level == SleepLevel::kDiscard && !b->keep)) {
      roles[b] = Leave::kDrop;
      continue;
    }
    ++kept;
    if (level == SleepLevel::kMigrate || bound == 0 || (b->placed && b->location.is_host()) ||
        b->size > bound - std::min(bound, planned)) {
      migrate.push_back({b->ptr(), b->size});
      continue;
    }
    planned += b->size;
    roles[b] = Leave::kStage;
  }
  std::vector<StagedBlock> stage;
  std::vector<Range> drop;
  std::vector<Block*> free_neighbours;
  for (Block* b : blocks) {
    auto role = roles.find(b);
    if (role == roles.end()) continue;
    Range part = LeavingPart(b, roles);
    if (part.bytes == 0) {
      migrate.push_back({b->ptr(), b->size});
      continue;
    }
    FreeNeighboursOnPages(b, part, &free_neighbours);
    const auto lo = reinterpret_cast<std::uintptr_t>(part.ptr);
    if (lo > b->addr) migrate.push_back({b->ptr(), lo - b->addr});
    if (lo + part.bytes < b->addr + b->size) {
      migrate.push_back({reinterpret_cast<void*>(lo + part.bytes),
                         b->addr + b->size - lo - part.bytes});
    }
    if (role->second == Leave::kStage) {
      // Only what the caller asked for is copied; the rounding beyond it
      // holds nothing and goes with the pages.
      const std::uintptr_t asked = b->addr + b->requested;
      Range copied = part;
      if (lo + copied.bytes > asked) copied.bytes = asked > lo ? asked - lo : 0;
      if (copied.bytes != 0) {
        stage.push_back({b, copied, part});
      }
    } else {
      drop.push_back(part);
    }
  }
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
  // And after the last use of each free block on a page that goes (its
  // stream's work may still read it), after the last Wake, whose
  // repopulation these discards must follow, and after every read of the
  // staging these copies overwrite.
  for (const Block* b : free_neighbours) users.insert(b->stream);
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
  StageOut(stage, stream, &migrate);
  absl::Status s = Execute(PlacementAction::kPrefetch, migrate, Location::Host(), stream);
  // The pages of the staged blocks' parts go (their rounding beyond the
  // request included: a free forgets every page inside a staged block).
  std::vector<Range> leaving = drop;
  for (const StagedBlock& p : stage) {
    if (staged_.contains(p.block->addr)) leaving.push_back(p.pages);  // (not staged: migrated)
  }
  // No page that anything migrating touches goes, whatever the plan
  // assumed (a part that found no room in the staging migrates).
  const std::vector<Range> discard = SplitAtSegments(PagesToDiscard(leaving, migrate));
  // A staged block none of whose pages go (each touched by something that
  // migrates) keeps its contents in place: its staged copy is moot, and a
  // Wake must not copy it back over them.
  for (const StagedBlock& p : stage) {
    const auto lo = reinterpret_cast<std::uintptr_t>(p.pages.ptr);
    if (staged_.contains(p.block->addr) && !OverlapsAny(discard, lo, lo + p.pages.bytes)) {
      Unstage(p.block->addr);
    }
  }
  if (s.ok() && !discard.empty()) {
    // After the copies out, in stream order: the pages' contents are in
    // the staging by the time they go.
    s = backend_->DiscardBatch(discard, stream);
    if (s.ok()) {
      discard_fence_.Mark(*backend_, device_, stream);
      ++stats_.discard_calls;
      stats_.discarded_bytes += static_cast<std::int64_t>(TotalBytes(discard));
      s = OrderFreeBlocksAfter(free_neighbours, stream);
      RememberEdgePages(leaving, discard);
    }
  }
  if (!s.ok()) {
    // The allocations stay as they were (a failed call discards nothing):
    // their pages hold their contents and the user may go on writing them,
    // so what this call staged is forgotten; kept, a Move or the next
    // cycle's Wake would copy that stale image back over newer writes.
    for (const StagedBlock& p : stage) Unstage(p.block->addr);
    sleep_wake_stream_ = stream;
    return absl::Status(s.code(), absl::StrCat("cma: sleep failed: ", s.message()));
  }
  for (Block* b : blocks) {
    // A discarded block counts as away too: whoever reuses it after its
    // free brings its pages back to the device.
    auto role = roles.find(b);
    const bool discarded = role != roles.end() && role->second == Leave::kDrop;
    if (discarded || staged_.contains(b->addr)) {
      b->pages_discarded = true;
      b->discarded_from = 0;  // all of them, whatever an earlier Move left
    }
    b->sleep_dropped = b->sleep_dropped || (discarded && b->disposable);
    b->placed = true;
    b->location = Location::Host();
  }
  sleep_wake_stream_ = stream;
  stats_.moves += static_cast<std::int64_t>(kept);
  // The cache sleeps too: idle memory goes back (arena pages by discard,
  // stream-ordered), so the device holds nothing of this allocator's.
  ProcessPendingFrees(/*synchronize=*/false);
  CoalesceUnmerged();
  ReleaseAsAsked(0);
  return bytes;
}

std::vector<Range> DeviceAllocator::SplitAtSegments(std::vector<Range> ranges) {
  std::vector<Range> out;
  for (const Range& r : ranges) {
    auto lo = reinterpret_cast<std::uintptr_t>(r.ptr);
    const std::uintptr_t hi = lo + r.bytes;
    while (lo < hi) {
      const Segment* seg = SegmentAt(lo);
      if (seg == nullptr) {  // not expected: every page here lies in a segment
        out.push_back({reinterpret_cast<void*>(lo), hi - lo});
        break;
      }
      const std::uintptr_t end = std::min(hi, seg->base + seg->size);
      out.push_back({reinterpret_cast<void*>(lo), end - lo});
      lo = end;
    }
  }
  return out;
}

void DeviceAllocator::RememberEdgePages(absl::Span<const Range> parts,
                                        absl::Span<const Range> discarded) {
  auto gone = [&](std::uintptr_t page) { return OverlapsAny(discarded, page, page + kPageSize); };
  for (const Range& p : parts) {
    const auto lo = reinterpret_cast<std::uintptr_t>(p.ptr), hi = lo + p.bytes;
    if (p.bytes == 0) continue;
    // Only pages the part shares (it starts or ends inside them); a page
    // wholly inside one block is that block's to account for.
    if (lo % kPageSize != 0 && gone(lo / kPageSize * kPageSize)) {
      slept_edge_pages_.insert(lo / kPageSize * kPageSize);
    }
    if (hi % kPageSize != 0 && gone(hi / kPageSize * kPageSize)) {
      slept_edge_pages_.insert(hi / kPageSize * kPageSize);
    }
  }
}

std::vector<Range> DeviceAllocator::TakeSleptEdgePages() {
  std::vector<Range> pages;
  for (std::uintptr_t page : slept_edge_pages_) {
    const Segment* seg = SegmentAt(page);
    if (seg == nullptr) continue;  // its segment has gone
    // (A classic segment counts as populated whole.)
    if (seg->arena && !seg->pages.populated(seg->PageOf(page))) continue;  // forgotten since
    pages.push_back({reinterpret_cast<void*>(page), kPageSize});
  }
  slept_edge_pages_.clear();
  std::sort(pages.begin(), pages.end(), [](const Range& x, const Range& y) {
    return x.ptr < y.ptr;
  });
  return pages;
}

absl::Status DeviceAllocator::OrderFreeBlocksAfter(absl::Span<Block* const> blocks,
                                                  Stream stream) {
  // Their streams take them back without asking the GPU (same-stream reuse)
  // or, once seen idle, lend them to others: both must come after the
  // discard queued on `stream`. So each stream waits for it, and the blocks
  // count as used from now (an idle mark older than the discard no longer
  // lends them).
  const std::uint64_t seq = ++free_seq_;
  absl::flat_hash_set<Stream> waiters;
  for (Block* b : blocks) {
    b->free_seq = seq;
    if (b->stream != stream) waiters.insert(b->stream);
  }
  for (Stream w : waiters) {
    if (absl::Status o = OrderAfter(w, stream); !o.ok()) {
      return absl::Status(o.code(), absl::StrCat("could not order a stream with free blocks on "
                                                 "the discarded pages after the sleep: ",
                                                 o.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceAllocator::CopyBack(const RestorePlan& plan, Location target, Stream stream) {
  // Pages first (populated at the target: the staged ones hold nothing),
  // then the copies into them, in stream order.
  absl::Status s = Execute(PlacementAction::kPrefetch, plan.prefetch, target, stream);
  if (s.ok()) s = Execute(PlacementAction::kDiscardAndPrefetch, plan.repopulate, target, stream);
  if (!s.ok() || plan.copies.empty()) return s;
  std::vector<Copy> copies;
  for (const StagedPart& c : plan.copies) {
    staging_.AppendCopies(c.offset, c.bytes.ptr, c.bytes.bytes, /*to_staging=*/false, &copies);
  }
  s = backend_->CopyBatch(copies, stream);
  if (s.ok()) stats_.sleep_restored_bytes += static_cast<std::int64_t>(plan.bytes);
  return s;
}

absl::Status DeviceAllocator::RestoreStaged(absl::Span<Block* const> blocks, Location target,
                                            Stream stream, bool contents_dead) {
  std::vector<StagedPart> parts;
  std::vector<Block*> mine;
  for (Block* b : blocks) {
    auto it = staged_.find(b->addr);
    if (it == staged_.end()) continue;
    mine.push_back(b);
    if (!contents_dead) parts.push_back({it->second.bytes, it->second.offset, b->segment});
  }
  if (mine.empty()) return absl::OkStatus();
  if (!contents_dead) {
    // After the Sleep's copies out and discards.
    if (absl::Status w = OrderAfter(stream, sleep_wake_stream_); !w.ok()) return w;
    if (discard_fence_.Order(*backend_, stream, /*end_cycle=*/false)) ++stats_.num_wake_fences;
    if (absl::Status s = CopyBack(PlanRestore(std::move(parts)), target, stream); !s.ok()) {
      return s;
    }
    if (stream != sleep_wake_stream_) staging_readers_.insert(stream);
  }
  for (Block* b : mine) {
    if (!contents_dead && target.is_host()) {
      // Only the copy came back: the whole pages beyond it, which held
      // the rounding past the request, stay discarded (a prefetch to the
      // host populates nothing), and the free forgets them.
      const Range& copied = staged_.find(b->addr)->second.bytes;
      const std::uintptr_t copied_end =
          reinterpret_cast<std::uintptr_t>(copied.ptr) + copied.bytes;
      const std::uintptr_t base = b->segment->base;
      const std::uintptr_t end =
          base + (copied_end - base + kPageSize - 1) / kPageSize * kPageSize;
      b->pages_discarded = end < b->addr + b->size;
      b->discarded_from = end;
    } else if (!contents_dead) {
      b->pages_discarded = false;
      b->discarded_from = 0;
    }
    Unstage(b->addr);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> DeviceAllocator::Wake(Stream stream) {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("wake"); !s.ok()) return s;
  DrainLearnedTransfers();
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  // Ordered after the Sleep, whichever stream each was given.
  if (absl::Status w = OrderAfter(stream, sleep_wake_stream_); !w.ok()) {
    return absl::Status(w.code(), absl::StrCat("cma: wake could not order after the sleep: ",
                                               w.message()));
  }
  const Location here = Location::Device(device_);
  // Everything comes back, also what was sent away while asleep (its inner
  // pages, wherever the block's own placement says it is): after the work
  // on each such block's stream (a discard of its pages may be queued
  // there), whatever its placement.
  absl::flat_hash_set<Stream> owners;
  for (auto& [addr, b] : allocated_) {
    if (b->away && b->stream != stream) owners.insert(b->stream);
  }
  std::vector<Range> migrate = CountBackAll(), repopulate;
  std::vector<StagedPart> parts;
  std::size_t bytes = 0;
  for (auto& [addr, b] : allocated_) {
    if ((b->placed && b->location == here) || !b->segment->placeable()) continue;
    bytes += b->size;
    const Range r{b->ptr(), b->size};
    auto st = staged_.find(addr);
    if (st != staged_.end()) {
      // Its staged part comes back by copy; what it has outside (on pages
      // that stayed) migrates.
      const Range& part = st->second.bytes;
      parts.push_back({part, st->second.offset, b->segment});
      const auto lo = reinterpret_cast<std::uintptr_t>(part.ptr);
      if (lo > addr) migrate.push_back({b->ptr(), lo - addr});
      if (lo + part.bytes < addr + b->size) {
        migrate.push_back({reinterpret_cast<void*>(lo + part.bytes), addr + b->size - lo - part.bytes});
      }
    } else if (b->disposable && b->sleep_dropped) {
      // Only what the Sleep discarded: a disposable allocation made while
      // asleep, never placed, or written since a Move holds live data.
      // (A non-disposable block a level-2 Sleep discarded migrates: a
      // prefetch populates pages that hold nothing.)
      SplitAtPages(r, &repopulate, &migrate);
    } else {
      migrate.push_back(r);
    }
  }
  // A block's stream may have a discard of its pages still queued (the
  // cache's idle pages released by the Sleep): the wake waits for those
  // streams too before it populates.
  for (auto& [addr, b] : allocated_) {
    if (!(b->placed && b->location == here) && b->segment->placeable() && b->stream != stream) {
      owners.insert(b->stream);
    }
  }
  for (Stream u : owners) {
    if (absl::Status w = OrderAfter(stream, u); !w.ok()) {
      return absl::Status(w.code(), absl::StrCat("cma: wake could not order after a stream "
                                                 "that owns an allocation: ", w.message()));
    }
  }
  if (discard_fence_.Order(*backend_, stream, /*end_cycle=*/true)) ++stats_.num_wake_fences;
  absl::Status s = Execute(PlacementAction::kPrefetch, migrate, here, stream);
  if (s.ok()) s = Execute(PlacementAction::kDiscardAndPrefetch, repopulate, here, stream);
  if (s.ok()) s = CopyBack(PlanRestore(std::move(parts)), here, stream);
  // Shared pages the Sleep discarded that the page map still counts: those
  // no block in use touches any more (freed while asleep) are populated
  // again too, so that the map and the device agree (the others already
  // are, by the migrations and copies above).
  if (s.ok()) s = Execute(PlacementAction::kPrefetch, TakeSleptEdgePages(), here, stream);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("cma: wake failed: ", s.message()));
  staged_.clear();
  staging_.Reset();
  std::size_t woken = 0;
  for (auto& [addr, b] : allocated_) {
    if (!b->segment->placeable()) continue;  // it stays where it is
    woken += !(b->placed && b->location == here);
    b->placed = true;
    b->location = here;
    b->pages_discarded = false;
    b->discarded_from = 0;
    b->sleep_dropped = false;
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
