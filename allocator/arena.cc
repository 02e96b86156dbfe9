// DeviceAllocator's arena mode: blocks carved from large managed address
// ranges whose kPageSize pages are the physical unit. A page is populated
// when a block on it is first handed out and discarded, ordered on the
// stream that last used it, when it is wholly free and its memory is wanted
// for another page; no arena is freed and no stream is synchronised in the
// steady state. reserved_bytes counts populated pages.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "allocator/format.h"
#include "policy/release_policy.h"

namespace cma {
namespace {

// Adds page `page` of `seg` to a list of ranges, extending the last range
// when the page touches either of its ends inside the same segment (pages
// come in ascending or descending order). Two arenas may be back to back in
// the address space, but no backend call takes a range across both.
void AddPage(std::vector<Range>& ranges, const Segment* seg, std::size_t page) {
  void* const addr = reinterpret_cast<void*>(seg->base + page * kPageSize);
  if (!ranges.empty()) {
    Range& last = ranges.back();
    if (page > 0 && static_cast<char*>(last.ptr) + last.bytes == addr) {
      last.bytes += kPageSize;
      return;
    }
    if (page + 1 < seg->pages.size() && static_cast<char*>(addr) + kPageSize == last.ptr) {
      last.ptr = addr;
      last.bytes += kPageSize;
      return;
    }
  }
  ranges.push_back({addr, kPageSize});
}

}  // namespace

absl::StatusOr<Block*> DeviceAllocator::NewArena(std::size_t rounded, PoolKind pool,
                                                 Stream stream) {
  const std::size_t wanted = config_->arena_size != 0 ? config_->arena_size : budget_;
  const std::size_t round = (std::max(wanted, rounded) + kPageSize - 1) / kPageSize * kPageSize;
  // A request larger than the budget cannot be populated anyway.
  if (rounded > budget_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s exceeds the managed budget of device %d (%s)", FormatBytes(rounded), device_,
        FormatBytes(budget_)));
  }
  absl::StatusOr<void*> mem = backend_->ReserveManaged(device_, round);
  if (!mem.ok()) return mem.status();
  Block* b = AddSegment(*mem, round, pool, stream);
  b->segment->arena = true;
  b->segment->pages = PageMap(round / kPageSize);
  stats_.virtual_bytes += static_cast<std::int64_t>(round);
  // Config advice once for the whole range; pages are placed as populated.
  if (quiet()) {
    unadvised_.push_back(b->segment->base);  // advised when the last pool context ends
  } else {
    ApplyAdvice(SegmentAdvice(*config_, device_, device_count_), b->ptr(), b->size);
  }
  return b;
}

std::size_t DeviceAllocator::FreshPagesFor(const Block* b, std::size_t bytes) const {
  const Segment* seg = b->segment;
  if (!seg->arena) return 0;
  const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + bytes - 1);
  return last + 1 - first - seg->pages.CountPopulated(first, last + 1);
}

absl::Status DeviceAllocator::MakeRoomForPages(const Block* b, std::size_t bytes, Stream stream,
                                               bool everything) {
  const Segment* seg = b->segment;
  const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + bytes - 1);
  const std::size_t fresh = FreshPagesFor(b, bytes);
  if (fresh == 0) return absl::OkStatus();  // the steady state: popcounts, no walk
  // The range lies in free block b: a page of it is in use only as the edge
  // page of a neighbour.
  // (A captured pool's idle pages are never discarded: they count as live
  // already, and reusing them changes nothing here.)
  std::size_t reused = 0;
  for (std::size_t p = first; p <= last && !seg->pinned; ++p) {
    reused += seg->pages.populated(p) && seg->pages.edge_users(p) == 0;
  }
  const std::size_t budget_pages = budget_ / kPageSize;
  const std::size_t keep_lo = seg->base + first * kPageSize;
  const std::size_t keep_hi = seg->base + (last + 1) * kPageSize;
  const std::size_t discardable = idle_pages_ - pinned_idle_pages_;
  const std::size_t live_after = populated_pages() - discardable + fresh + reused;
  std::size_t discard =
      everything ? discardable
                 : IdlePagesToDiscard(*config_, populated_pages(), discardable - reused, fresh,
                                      live_after, peak_live_pages_, budget_pages);
  if (discard > 0 && !quiet()) DiscardIdlePages(discard, keep_lo, keep_hi, &stream);
  // Wholly free segments of released pools (classic ones, captured pools'
  // arenas) hold reserved memory whole: out of room, they go too.
  if (everything && !quiet() && populated_pages() + fresh > budget_pages) {
    ReleaseIdleSegments((populated_pages() + fresh - budget_pages) * kPageSize, 0,
                        /*classic_only=*/true);
  }
  if (populated_pages() + fresh > budget_pages) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "populating %s more would exceed the managed budget of device %d (%s populated of %s)",
        FormatBytes(fresh * kPageSize), device_, FormatBytes(populated_pages() * kPageSize),
        FormatBytes(budget_)));
  }
  return absl::OkStatus();
}

// See allocator/page_map.h: only a block's first and last pages can be
// shared, so its interior is handled with popcounts.
void DeviceAllocator::AcquirePages(Block* b, bool all_populated) {
  Segment* seg = b->segment;
  PageMap& pages = seg->pages;
  const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
  populate_.clear();
  std::size_t fresh = 0, reused_idle = 0;
  const bool by_small = b->size_class == PoolKind::kSmall;
  auto populate = [&](std::size_t p) {
    pages.set_populated(p, by_small);
    ++fresh;
    AddPage(populate_, seg, p);
  };
  auto touch_edge = [&](std::size_t p) {
    if (pages.edge_users(p)++ != 0) return;  // a neighbour in use has it
    if (pages.populated(p)) {
      ++reused_idle;
    } else {
      populate(p);
    }
  };
  touch_edge(first);
  if (last > first + 1) {
    const std::size_t n = all_populated ? last - first - 1 : pages.CountPopulated(first + 1, last);
    reused_idle += n;
    if (n != last - first - 1) {
      for (std::size_t p = first + 1; p < last; ++p) {
        if (!pages.populated(p)) populate(p);
      }
    }
  }
  if (last != first) touch_edge(last);
  idle_pages_ -= reused_idle;
  if (seg->pinned) pinned_idle_pages_ -= reused_idle;
  stats_.idle_populated_bytes -= static_cast<std::int64_t>(reused_idle * kPageSize);
  if (fresh != 0) {
    stats_.num_pages_populated += static_cast<std::int64_t>(fresh);
    UpdateStat(stats_.reserved_bytes, b->size_class, static_cast<std::int64_t>(fresh * kPageSize));
  }
  NoteLivePages();
}

void DeviceAllocator::ReleasePages(Block* b) {
  Segment* seg = b->segment;
  PageMap& pages = seg->pages;
  const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
  std::size_t idle = 0;
  auto untouch_edge = [&](std::size_t p) {
    if (--pages.edge_users(p) == 0 && pages.populated(p)) ++idle;
  };
  untouch_edge(first);
  // Only idle pages are ever discarded, so every page of a block in use is
  // populated (CheckInvariants verifies it): no need to count.
  // (An away block's inner pages are not populated: away.cc forgets them.)
  if (last > first + 1 && !b->away) idle += last - first - 1;
  if (last != first) untouch_edge(last);
  idle_pages_ += idle;
  if (seg->pinned) pinned_idle_pages_ += idle;
  stats_.idle_populated_bytes += static_cast<std::int64_t>(idle * kPageSize);
}

std::size_t DeviceAllocator::DiscardIdlePages(std::size_t pages, std::uintptr_t keep_lo,
                                              std::uintptr_t keep_hi, const Stream* populating,
                                              absl::flat_hash_set<Stream>* queued_on,
                                              bool settled) {
  if (pages == 0 || idle_pages_ == 0) return 0;
  FlushRecent();  // a recently freed block is known to be wholly populated
  // Candidates in address order: (segment, page, stream of its free blocks).
  struct Candidate {
    Segment* seg;
    std::size_t page;
    Stream stream;
    bool mixed;
    Block* first;  // the first free block on the page
  };
  std::vector<Candidate> candidates;
  absl::flat_hash_set<std::pair<const Segment*, std::size_t>> pinned;  // private pools' pages
  for (auto& [base, seg] : segments_) {
    if (!seg->arena || seg->pages.populated_count() == 0) continue;
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      // A free block's page is in use only as the edge page of a neighbour.
      if (!b->is_free()) continue;
      // A captured pool's free blocks are never discarded: a CUDA graph
      // replays into the blocks its capture freed, on whatever stream.
      if (PoolPagesPinned(b->mempool)) {
        const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
        if (!candidates.empty() && candidates.back().seg == seg && candidates.back().page >= first &&
            candidates.back().page <= last) {
          candidates.back().mixed = true;
        }
        for (std::size_t p = first; p <= last; ++p) pinned.insert({seg, p});
        continue;
      }
      const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
      for (std::size_t p = first; p <= last; ++p) {
        if (seg->pages.edge_users(p) != 0 || !seg->pages.populated(p)) continue;
        const std::uintptr_t page_addr = seg->base + p * kPageSize;
        if (page_addr >= keep_lo && page_addr < keep_hi) continue;
        if (!candidates.empty() && candidates.back().seg == seg && candidates.back().page == p) {
          // A later free block on the same page: the discard must be ordered
          // after every stream's last use, so mixed pages stay populated
          // unless every stream's work has been waited for.
          if (candidates.back().stream != b->stream && !settled) candidates.back().mixed = true;
          continue;
        }
        candidates.push_back({seg, p, b->stream, false, b});
      }
    }
  }
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [&](const Candidate& c) {
                                    return pinned.contains({c.seg, c.page});
                                  }),
                   candidates.end());
  // The populating stream's own pages first (its stream order already puts
  // the discard before the population); then, highest addresses first (best
  // fit takes the lowest address among equal sizes, so the high end is the
  // least likely to be wanted again soon).
  absl::flat_hash_map<Stream, std::vector<Range>> by_stream;
  std::vector<const Candidate*> chosen;
  for (int own = populating != nullptr ? 1 : 0; own >= 0 && chosen.size() < pages; --own) {
    for (auto it = candidates.rbegin(); it != candidates.rend() && chosen.size() < pages; ++it) {
      if (it->mixed || (populating != nullptr && (it->stream == *populating) != (own == 1))) {
        continue;
      }
      chosen.push_back(&*it);
      AddPage(by_stream[it->stream], it->seg, it->page);
    }
  }
  // Then, for a populating stream, pages whose free blocks belong to several
  // streams: discarded on the populating stream once it has waited (on the
  // GPU) for every stream owning a free block there, rather than the host
  // waiting for those streams (SettleFreeBlockStreams), which would drain
  // the queue of kernels the caller has launched ahead.
  if (populating != nullptr && chosen.size() < pages) {
    std::vector<Candidate*> mixed;
    absl::flat_hash_set<Stream> owners;
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
      if (!it->mixed || chosen.size() + mixed.size() >= pages) continue;
      const std::uintptr_t page_end = it->seg->base + (it->page + 1) * kPageSize;
      for (const Block* b = it->first; b != nullptr && b->addr < page_end; b = b->next) {
        if (b->is_free() && b->stream != *populating) owners.insert(b->stream);
      }
      mixed.push_back(&*it);
    }
    bool ordered = true;
    for (Stream s : owners) {
      if (!OrderAfter(*populating, s).ok()) ordered = false;
    }
    if (ordered && !mixed.empty()) {
      for (Candidate* c : mixed) {
        c->stream = *populating;
        chosen.push_back(c);
        AddPage(by_stream[c->stream], c->seg, c->page);
      }
      stats_.num_discard_waits += static_cast<std::int64_t>(owners.size());
    }
  }
  absl::flat_hash_map<Stream, bool> discarded;
  for (auto& [stream, ranges] : by_stream) {
    absl::StatusOr<bool> d = DiscardDead(ranges, stream);
    discarded[stream] = d.ok();
    if (!d.ok()) {
      NotePlacementError(d.status());  // the pages stay populated and valid
      continue;
    }
    if (!*d) continue;  // kept (learn_step): booked as given back, nothing queued to wait for
    ++stats_.discard_calls;
    if (queued_on != nullptr) queued_on->insert(stream);
    // The driver reuses discarded memory for the next population only once
    // the discard has run: the populating stream waits for it on the GPU (no
    // host sync), or both pages would be populated at once.
    if (populating != nullptr && stream != *populating) {
      // An event wait, or a host sync if no event can be had.
      if (OrderAfter(*populating, stream).ok()) ++stats_.num_discard_waits;
    }
  }
  // The discard is queued behind the work on its stream: a block on a
  // discarded page counts as used again from now, so that no stream takes
  // it (AdoptIdleStreams) on the strength of an idle mark older than the
  // discard; it asks the GPU, or waits, first.
  const std::uint64_t seq = ++free_seq_;
  std::size_t done = 0;
  absl::flat_hash_set<std::pair<Stream, Stream>> ordered;
  for (const Candidate* c : chosen) {
    if (!discarded[c->stream]) continue;
    ForgetIdlePage(c->seg, c->page);
    const std::uintptr_t page_end = c->seg->base + (c->page + 1) * kPageSize;
    for (Block* b = c->first; b != nullptr && b->addr < page_end; b = b->next) {
      if (!b->is_free()) continue;
      b->free_seq = seq;
      // (Settled, a page may hold other streams' free blocks: each of them
      // reuses its block, on its own stream, only after the discard, even
      // if the caller's final wait for the discard's stream fails; unless
      // neither an event nor a wait can be had, a counted placement error.)
      if (b->stream != c->stream && ordered.insert({b->stream, c->stream}).second) {
        if (absl::Status w = OrderAfter(b->stream, c->stream); !w.ok()) {
          NotePlacementError(std::move(w));
        }
      }
    }
    ++done;
  }
  return done;
}

bool DeviceAllocator::SettleFreeBlockStreams() {
  absl::flat_hash_set<Stream> streams;
  for (const auto& [base, seg] : segments_) {
    if (!seg->arena) continue;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->is_free() && !PoolPagesPinned(b->mempool)) streams.insert(b->stream);
    }
  }
  bool all = true;
  for (Stream s : streams) {
    if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) {
      NotePlacementError(std::move(w));
      all = false;
    }
  }
  return all;
}

void DeviceAllocator::ForgetIdlePage(Segment* seg, std::size_t page) {
  const PoolKind kind = seg->pages.small(page) ? PoolKind::kSmall : PoolKind::kLarge;
  seg->pages.clear_populated(page);
  // Discarded again on some stream: Wake leaves it to whoever populates it next.
  if (ABSL_PREDICT_FALSE(!slept_edge_pages_.empty())) {
    slept_edge_pages_.erase(seg->base + page * kPageSize);
  }
  UpdateStat(stats_.reserved_bytes, kind, -static_cast<std::int64_t>(kPageSize));
  --idle_pages_;
  if (seg->pinned) --pinned_idle_pages_;
  stats_.idle_populated_bytes -= static_cast<std::int64_t>(kPageSize);
  ++stats_.num_pages_discarded;
  stats_.discarded_bytes += static_cast<std::int64_t>(kPageSize);
}

void DeviceAllocator::DiscardPagesInside(Block* b, bool already_discarded, bool pool_too,
                                         std::uintptr_t from) {
  // A captured pool keeps its free blocks' pages (see DiscardIdlePages), but
  // pages a Sleep has discarded hold nothing whoever owns them.
  if (PoolPagesPinned(b->mempool) && !already_discarded && !pool_too) return;
  // Only pages that lie wholly inside the block: its own stream is then the
  // only one whose work can still touch them.
  Segment* seg = b->segment;
  const std::size_t first = (std::max(b->addr, from) - seg->base + kPageSize - 1) / kPageSize;
  const std::size_t end = (b->addr + b->size - seg->base) / kPageSize;
  std::vector<Range> ranges;
  std::vector<std::size_t> idle;
  for (std::size_t p = first; p < end; ++p) {
    if (seg->pages.edge_users(p) != 0 || !seg->pages.populated(p)) continue;
    AddPage(ranges, seg, p);
    idle.push_back(p);
  }
  if (idle.empty()) return;
  if (already_discarded) {
    for (std::size_t p : idle) {
      ForgetIdlePage(seg, p);
      stats_.discarded_bytes -= static_cast<std::int64_t>(kPageSize);  // Sleep counted them
    }
    return;
  }
  absl::StatusOr<bool> d = DiscardDead(ranges, b->stream);
  if (!d.ok()) {
    NotePlacementError(d.status());
    return;
  }
  for (std::size_t p : idle) ForgetIdlePage(seg, p);
  if (*d) ++stats_.discard_calls;
}

void DeviceAllocator::DiscardKeptPages(absl::flat_hash_set<Stream>* queued_on) {
  // Nothing may still touch them: the free blocks' streams are waited for
  // first (a release the user asked for, as rare as PyTorch's empty_cache,
  // which waits for the device too); one that cannot be may still read its
  // free blocks' pages, and nothing goes.
  if (!SettleFreeBlockStreams()) return;
  std::vector<Range> ranges;
  for (auto& [base, seg] : segments_) {
    if (!seg->arena) continue;
    std::size_t added = seg->pages.size();  // the last page added (two free blocks share one)
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      // (A captured pool keeps its free blocks' pages; an away block's
      // inner pages are unpopulated but live: only free blocks' go.)
      if (!b->is_free() || PoolPagesPinned(b->mempool)) continue;
      const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
      for (std::size_t p = first; p <= last; ++p) {
        if (p == added || seg->pages.populated(p) || seg->pages.edge_users(p) != 0) continue;
        AddPage(ranges, seg, p);
        added = p;
      }
    }
  }
  if (ranges.empty()) return;
  if (absl::Status d = backend_->DiscardBatch(ranges, kDefaultStream); !d.ok()) {
    NotePlacementError(std::move(d));
    return;
  }
  ++stats_.discard_calls;
  queued_on->insert(kDefaultStream);
}

absl::Status DeviceAllocator::OrderAfter(Stream waiter, Stream on) {
  if (waiter == on) return absl::OkStatus();
  absl::StatusOr<Event> ev = TakeEvent();
  absl::Status s = ev.status();
  if (ev.ok()) {
    s = backend_->RecordEvent(*ev, on);
    if (s.ok()) s = backend_->StreamWaitEvent(waiter, *ev);
    spare_events_.push_back(*ev);
  }
  if (!s.ok()) s = backend_->SynchronizeStream(on);
  return s;
}

}  // namespace cma
