#include "policy/host_plan.h"

#include <algorithm>
#include <queue>
#include <tuple>

namespace cma {

std::vector<bool> PlanHostPlacement(absl::Span<const Lifetime> own,
                                    absl::Span<const Lifetime> carried, std::size_t capacity) {
  // Events in time order; at one time, frees before allocations (an event
  // time holds one allocation or one free, but carried ones may share 0).
  struct Event {
    std::int64_t time;
    bool is_alloc;
    bool is_own;
    std::size_t index;
  };
  std::vector<Event> events;
  events.reserve(2 * (own.size() + carried.size()));
  for (std::size_t i = 0; i < carried.size(); ++i) {
    events.push_back({0, true, false, i});
    if (carried[i].end != Lifetime::kNeverFreed) events.push_back({carried[i].end, false, false, i});
  }
  for (std::size_t i = 0; i < own.size(); ++i) {
    events.push_back({own[i].start, true, true, i});
    if (own[i].end != Lifetime::kNeverFreed) events.push_back({own[i].end, false, true, i});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.time, a.is_alloc) < std::tie(b.time, b.is_alloc);
  });
  std::vector<bool> host(own.size(), false), freed(own.size(), false);
  // Live own allocations, the one freed last on top (ties: the later one).
  std::priority_queue<std::pair<std::int64_t, std::size_t>> live;
  std::size_t live_bytes = 0;
  for (const Event& e : events) {
    const Lifetime& l = e.is_own ? own[e.index] : carried[e.index];
    if (!e.is_alloc) {
      if (e.is_own) {
        freed[e.index] = true;
        if (host[e.index]) continue;
      }
      live_bytes -= l.bytes;
      continue;
    }
    live_bytes += l.bytes;
    if (!e.is_own) continue;
    live.push({l.end, e.index});
    while (live_bytes > capacity && !live.empty()) {
      const std::size_t victim = live.top().second;
      live.pop();
      if (freed[victim] || host[victim]) continue;  // stale entry
      host[victim] = true;
      live_bytes -= own[victim].bytes;
    }
  }
  return host;
}

}  // namespace cma
