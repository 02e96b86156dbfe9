// DeviceAllocator's lookups: which free block serves a request.
//
// Free blocks belong to the stream that last used them: on that stream they
// can be reused at once, on any other only once the work queued there before
// the free has completed. Classic segments borrow one block of an idle
// stream (FindCrossStream). Arenas adopt every free block of an idle stream
// instead (AdoptIdleStreams): the adopted blocks merge with their new
// stream's neighbours, so the two streams' holes in the populated pages
// become one hole, and a request that fitted neither fits that.
#include <algorithm>
#include <vector>

#include "allocator/device_allocator.h"
#include "policy/size_policy.h"

namespace cma {

BlockPool::iterator DeviceAllocator::FindFit(std::size_t rounded, PoolKind pool, Stream stream,
                                             std::uint32_t mempool) {
  BlockPool& p = PoolOf(pool);
  Block key;
  key.mempool = mempool;
  key.stream = stream;
  key.size = rounded;
  auto it = p.lower_bound(&key);
  if (it == p.end() || (*it)->mempool != mempool || (*it)->stream != stream ||
      !CanServe((*it)->size, rounded, *config_)) {
    return p.end();
  }
  return it;
}

Block* DeviceAllocator::FindSameStream(std::size_t rounded, PoolKind pool, Stream stream,
                                       std::uint32_t mempool, std::size_t* fresh_pages) {
  BlockPool& p = PoolOf(pool);
  auto it = FindFit(rounded, pool, stream, mempool);
  // A fit that needs no split is the best there is. Anything else is judged
  // only after deferred merges, or a large block would be split where merged
  // fragments fit better.
  if (!unmerged_.empty() &&
      (it == p.end() || ShouldSplit((*it)->size, rounded, pool, *config_))) {
    CoalesceUnmerged();
    it = FindFit(rounded, pool, stream, mempool);
  }
  if (it == p.end()) return nullptr;
  std::size_t fresh = arena_mode() ? FreshPagesFor(*it, rounded) : 0;
  if (fresh != 0) {
    // Memory already populated beats a tighter fit that needs new pages:
    // the driver does not give populated memory back by itself, so new
    // pages raise the device's high-water mark. Look a few sizes up.
    auto alt = it;
    for (int i = 0; i < kPopulatedSearch && ++alt != p.end() && (*alt)->stream == stream &&
                    (*alt)->mempool == mempool;
         ++i) {
      if (FreshPagesFor(*alt, rounded) == 0) {
        it = alt;
        fresh = 0;
        break;
      }
    }
  }
  if (fresh_pages != nullptr) *fresh_pages = fresh;
  Block* b = *it;
  p.erase(it);
  CountInactiveSplit(b, -1);
  return b;
}

BlockPool::iterator DeviceAllocator::StreamRunEnd(BlockPool& p, std::uint32_t mempool, Stream s) {
  // The pool is ordered by private pool and stream first: each stream's free
  // blocks are one run, which ends before the first key above all its sizes.
  Block key;
  key.mempool = mempool;
  key.stream = s;
  key.size = ~std::size_t{0};
  key.addr = ~std::uintptr_t{0};
  return p.upper_bound(&key);
}

bool DeviceAllocator::StreamIsIdle(Stream s, bool synchronize) {
  // Everything in the pools was freed before now, so once the work queued on
  // `s` by now has completed, nothing can still touch s's free blocks.
  if (synchronize) return backend_->SynchronizeStream(s).ok();
  absl::StatusOr<bool> idle = backend_->QueryStream(s);
  return idle.ok() && *idle;
}

Block* DeviceAllocator::FindCrossStream(std::size_t rounded, PoolKind pool, Stream stream,
                                        bool synchronize) {
  BlockPool& p = PoolOf(pool);
  std::vector<Block*> candidates;  // the best fit of each other stream
  // The shared cache's blocks sort first (private pools lend nothing); the
  // sentinel sorts last.
  for (auto it = p.begin(); it != p.end() && (*it)->mempool == 0;) {
    const Stream s = (*it)->stream;
    if (s != stream) {
      Block key;
      key.stream = s;
      key.size = rounded;
      auto c = p.lower_bound(&key);
      if (c != p.end() && (*c)->mempool == 0 && (*c)->stream == s &&
          CanServe((*c)->size, rounded, *config_)) {
        candidates.push_back(*c);
      }
    }
    it = StreamRunEnd(p, 0, s);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Block* a, const Block* b) { return a->size < b->size; });
  for (Block* c : candidates) {
    if (StreamIsIdle(c->stream, synchronize)) {
      EraseFree(c);
      ++stats_.num_cross_stream_reuse;
      return c;
    }
  }
  return nullptr;
}

std::uint64_t DeviceAllocator::PollIdleMarks(Stream s) {
  std::uint64_t& through = idle_through_[s];
  auto it = idle_marks_.find(s);
  if (it == idle_marks_.end()) return through;
  std::vector<IdleMark>& marks = it->second;
  std::size_t done = 0;  // marks complete in order: a stream runs its work in order
  while (done < marks.size()) {
    absl::StatusOr<bool> q = backend_->QueryEvent(marks[done].event);
    if (!q.ok() || !*q) break;
    through = std::max(through, marks[done].seq);
    spare_events_.push_back(marks[done].event);
    ++done;
  }
  marks.erase(marks.begin(), marks.begin() + static_cast<std::ptrdiff_t>(done));
  if (marks.empty()) idle_marks_.erase(it);
  return through;
}

void DeviceAllocator::MarkIdleLater(Stream s) {
  std::vector<IdleMark>& marks = idle_marks_[s];
  if (marks.size() >= kIdleMarks || (!marks.empty() && marks.back().seq == free_seq_)) return;
  absl::StatusOr<Event> e = TakeEvent();
  if (!e.ok()) return;
  if (!backend_->RecordEvent(*e, s).ok()) {
    spare_events_.push_back(*e);
    return;
  }
  marks.push_back({*e, free_seq_});
}


bool DeviceAllocator::AdoptIdleStreams(std::size_t rounded, PoolKind pool, Stream stream,
                                       bool synchronize, bool may_query, std::uint32_t mempool) {
  BlockPool& p = PoolOf(pool);
  Block first;  // the lowest key of `mempool`'s blocks (the shared cache's: 0)
  first.mempool = mempool;
  first.stream = 0;
  first.size = 0;
  first.addr = 0;
  // A block next to a free block or to one of `stream`'s merges into a
  // larger hole once it is `stream`'s.
  const auto joins = [stream](const Block* n) {
    return n != nullptr && (n->is_free() || n->stream == stream);
  };
  // Collect what may be adopted, one stream's run at a time, then re-key it.
  std::vector<Block*> adopted;
  for (auto it = p.lower_bound(&first); it != p.end() && (*it)->mempool == mempool;) {
    const Stream s = (*it)->stream;
    const auto end = StreamRunEnd(p, mempool, s);
    if (s == stream) {
      it = end;
      continue;
    }
    // A block freed before the stream was last known idle is idle whatever
    // the stream did since; the stream is asked (once) only for the others.
    // Found busy, it gets a mark that tells a later request when the work
    // queued before these frees has completed: a stream that was idle at
    // some queries and not at others (FSDP2's, on the GPU) gave its blocks
    // away when idle and could not take them back while busy, so each
    // populated new pages in turn (issue 49: a third more than the trace
    // needs; bench/results/README.md, "FSDP2's footprint").
    auto known = idle_through_.find(s);
    std::uint64_t idle_through = known == idle_through_.end() ? 0 : known->second;
    bool asked = false;
    const auto idle = [&](const Block* b) {
      if (b->free_seq <= idle_through) return true;
      if (asked || !may_query) return false;
      asked = true;
      idle_through = PollIdleMarks(s);
      if (b->free_seq <= idle_through) return true;
      if (synchronize) {
        if (!StreamIsIdle(s, /*synchronize=*/true)) return false;
      } else {
        // Marked only when the stream answered "busy": a failed query (a
        // stream capturing behind the allocator's back) gets no event, which
        // would join that capture.
        absl::StatusOr<bool> q = backend_->QueryStream(s);
        if (!q.ok()) return false;
        if (!*q) {
          MarkIdleLater(s);
          return false;
        }
      }
      idle_through = idle_through_[s] = free_seq_;
      return true;
    };
    // Only blocks that can serve the request, alone or merged with a free
    // neighbour: re-keying the others would cost btree work for nothing.
    for (; it != end; ++it) {
      const Block* b = *it;
      if ((b->size >= rounded || joins(b->prev) || joins(b->next)) && idle(b)) {
        adopted.push_back(*it);
      }
    }
  }
  for (Block* b : adopted) {
    EraseFree(b);
    b->stream = stream;
    b->free_seq = 0;  // unused since its old stream finished: idle for all
    ReturnBlock(b);   // merged with its new stream's neighbours by the caller
  }
  stats_.num_cross_stream_reuse += static_cast<std::int64_t>(adopted.size());
  return !adopted.empty();
}

}  // namespace cma
