#include "allocator/sleep_plan.h"

#include <algorithm>

#include "policy/size_policy.h"

namespace cma {
namespace {

std::uintptr_t Down(std::uintptr_t a) { return a / kPageSize * kPageSize; }
std::uintptr_t Up(std::uintptr_t a) { return (a + kPageSize - 1) / kPageSize * kPageSize; }
std::uintptr_t Lo(const Range& r) { return reinterpret_cast<std::uintptr_t>(r.ptr); }
std::uintptr_t Hi(const Range& r) { return Lo(r) + r.bytes; }
Range Between(std::uintptr_t lo, std::uintptr_t hi) {
  return {reinterpret_cast<void*>(lo), hi - lo};
}

bool Leaves(const Block* x, const LeaveRoles& roles) {
  // A free block has no contents and no stream still using it; a private
  // pool's is never discarded (a CUDA graph replays into it).
  if (x->is_free()) return x->mempool == 0;
  return x->allocated && roles.contains(x);
}

// Whether the page at `page`, which `b` touches, may be discarded whole.
bool PageMayGo(const Block* b, std::uintptr_t page, const LeaveRoles& roles) {
  const Segment* seg = b->segment;
  if (seg == nullptr || page < seg->base || page + kPageSize > seg->base + seg->size) {
    return false;  // part of the page is not this segment's
  }
  for (const Block* x = b->prev; x != nullptr && x->addr + x->size > page; x = x->prev) {
    if (!Leaves(x, roles)) return false;
  }
  for (const Block* x = b->next; x != nullptr && x->addr < page + kPageSize; x = x->next) {
    if (!Leaves(x, roles)) return false;
  }
  return true;
}

}  // namespace

void FreeNeighboursOnPages(const Block* b, const Range& part, std::vector<Block*>* out) {
  if (part.bytes == 0) return;
  const std::uintptr_t lo = Down(Lo(part)), hi = Up(Hi(part));
  for (Block* x = b->prev; x != nullptr && x->addr + x->size > lo; x = x->prev) {
    if (x->is_free()) out->push_back(x);
  }
  for (Block* x = b->next; x != nullptr && x->addr < hi; x = x->next) {
    if (x->is_free()) out->push_back(x);
  }
}

bool OverlapsAny(absl::Span<const Range> sorted, std::uintptr_t lo, std::uintptr_t hi) {
  // The last range starting below hi is the only candidate.
  auto it = std::upper_bound(sorted.begin(), sorted.end(), hi - 1,
                             [](std::uintptr_t a, const Range& r) { return a < Lo(r); });
  return it != sorted.begin() && lo < Hi(*std::prev(it));
}

Range LeavingPart(const Block* b, const LeaveRoles& roles) {
  const std::uintptr_t lo = b->addr, hi = b->addr + b->size;
  const std::uintptr_t from = lo % kPageSize == 0 || PageMayGo(b, Down(lo), roles) ? lo : Up(lo);
  const std::uintptr_t to = hi % kPageSize == 0 || PageMayGo(b, Down(hi), roles) ? hi : Down(hi);
  if (from >= to) return {reinterpret_cast<void*>(lo), 0};
  return Between(from, to);
}

std::vector<Range> PagesToDiscard(absl::Span<const Range> parts, absl::Span<const Range> stays) {
  std::vector<Range> pages;
  for (const Range& p : parts) {
    if (p.bytes != 0) pages.push_back(Between(Down(Lo(p)), Up(Hi(p))));
  }
  std::sort(pages.begin(), pages.end(), [](const Range& a, const Range& b) { return Lo(a) < Lo(b); });
  std::vector<Range> blocked;  // page-rounded ranges that must stay
  for (const Range& s : stays) {
    if (s.bytes != 0) blocked.push_back(Between(Down(Lo(s)), Up(Hi(s))));
  }
  std::sort(blocked.begin(), blocked.end(),
            [](const Range& a, const Range& b) { return Lo(a) < Lo(b); });
  std::vector<Range> out;
  auto emit = [&out](std::uintptr_t lo, std::uintptr_t hi) {
    if (lo >= hi) return;
    if (!out.empty() && Hi(out.back()) >= lo) {
      out.back().bytes = std::max(Hi(out.back()), hi) - Lo(out.back());
    } else {
      out.push_back(Between(lo, hi));
    }
  };
  std::size_t k = 0;
  for (const Range& p : pages) {
    std::uintptr_t lo = Lo(p);
    const std::uintptr_t hi = Hi(p);
    while (k < blocked.size() && Hi(blocked[k]) <= lo) ++k;
    // Cut out every blocked range that overlaps [lo, hi).
    for (std::size_t j = k; j < blocked.size() && Lo(blocked[j]) < hi; ++j) {
      emit(lo, std::min(hi, Lo(blocked[j])));
      lo = std::max(lo, Hi(blocked[j]));
    }
    emit(lo, hi);
  }
  return out;
}

RestorePlan PlanRestore(std::vector<StagedPart> parts) {
  RestorePlan plan;
  std::sort(parts.begin(), parts.end(),
            [](const StagedPart& a, const StagedPart& b) { return Lo(a.bytes) < Lo(b.bytes); });
  std::vector<Range> covered;  // what the copies write, merged
  for (const StagedPart& p : parts) {
    if (p.bytes.bytes == 0) continue;
    plan.bytes += p.bytes.bytes;
    const bool same_segment = !plan.copies.empty() && plan.copies.back().segment == p.segment;
    if (same_segment && Hi(covered.back()) == Lo(p.bytes)) {
      covered.back().bytes += p.bytes.bytes;
    } else {
      covered.push_back(p.bytes);
    }
    StagedPart* last = same_segment ? &plan.copies.back() : nullptr;
    if (last != nullptr && Hi(last->bytes) == Lo(p.bytes) &&
        last->offset + last->bytes.bytes == p.offset) {
      last->bytes.bytes += p.bytes.bytes;
    } else {
      plan.copies.push_back(p);
    }
  }
  // One range per page (adjacent pages may belong to two segments, which
  // one range must not span).
  auto prefetch_page = [&plan](std::uintptr_t page) {
    if (!plan.prefetch.empty() && Hi(plan.prefetch.back()) > page) return;  // already there
    plan.prefetch.push_back(Between(page, page + kPageSize));
  };
  for (const Range& c : covered) {
    const std::uintptr_t lo = Lo(c), hi = Hi(c);
    const std::uintptr_t whole_lo = Up(lo), whole_hi = Down(hi);
    if (whole_lo >= whole_hi) {  // no page wholly written: all shared
      for (std::uintptr_t p = Down(lo); p < hi; p += kPageSize) prefetch_page(p);
      continue;
    }
    if (lo < whole_lo) prefetch_page(Down(lo));
    plan.repopulate.push_back(Between(whole_lo, whole_hi));
    if (whole_hi < hi) prefetch_page(whole_hi);
  }
  return plan;
}

}  // namespace cma
