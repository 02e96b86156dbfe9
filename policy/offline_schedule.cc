// The step's builder and the offline heuristic (policy/offline_schedule.h).
// The lower bound and the step's sizes are in offline_bound.cc.
#include "policy/offline_schedule.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/strings/str_format.h"

namespace cma {
namespace {

std::string Bytes(std::uint64_t b) {
  return absl::StrFormat("%d bytes (%.3f GiB)", b, static_cast<double>(b) / (1 << 30));
}

}  // namespace

std::int32_t Step::IndexOf(std::uint64_t id) const {
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second;
}

absl::Status Step::Declare(std::uint64_t id, std::size_t bytes, std::size_t movable,
                           bool carried) {
  if (index_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "id %d is declared twice (alloc or live): an id names one allocation", id));
  }
  if (allocations_.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return absl::InvalidArgumentError("too many allocations in one step");
  }
  Allocation a;
  a.id = id;
  a.bytes = bytes;
  a.movable = movable;
  a.carried = carried;
  if (!carried) a.alloc_event = static_cast<std::int64_t>(events_.size());
  index_[id] = static_cast<std::int32_t>(allocations_.size());
  allocations_.push_back(a);
  if (!carried) {
    Event e;
    e.kind = Kind::kAlloc;
    e.allocation = index_[id];
    events_.push_back(e);
  }
  return absl::OkStatus();
}

absl::Status Step::Live(std::uint64_t id, std::size_t bytes, std::size_t movable) {
  return Declare(id, bytes, movable, true);
}

absl::Status Step::Alloc(std::uint64_t id, std::size_t bytes, std::size_t movable) {
  return Declare(id, bytes, movable, false);
}

absl::Status Step::Use(absl::Span<const StepAccess> accesses) {
  if (accesses.empty()) return absl::InvalidArgumentError("a use names no allocation");
  const std::int64_t event = static_cast<std::int64_t>(events_.size());
  // Check everything before changing anything: a rejected use leaves no trace.
  std::vector<Access> merged;
  for (const StepAccess& a : accesses) {
    const std::int32_t i = IndexOf(a.id);
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("id %d is used before it is declared (alloc or live)", a.id));
    }
    if (allocations_[i].free_event >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat("id %d is used after its free", a.id));
    }
    const bool writes = a.mode != AccessMode::kRead;
    auto same = std::find_if(merged.begin(), merged.end(),
                             [i](const Access& m) { return m.allocation == i; });
    if (same != merged.end()) {
      same->writes = same->writes || writes;
    } else {
      merged.push_back({i, writes});
    }
  }
  Event e;
  e.kind = Kind::kUse;
  e.access_begin = static_cast<std::int64_t>(accesses_.size());
  for (const Access& a : merged) {
    Allocation& al = allocations_[a.allocation];
    if (al.first_use < 0) al.first_use = event;
    al.last_use = event;
    accesses_.push_back(a);
  }
  e.access_end = static_cast<std::int64_t>(accesses_.size());
  events_.push_back(e);
  return absl::OkStatus();
}

absl::Status Step::Free(std::uint64_t id) {
  const std::int32_t i = IndexOf(id);
  if (i < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("id %d is freed before it is declared (alloc or live)", id));
  }
  if (allocations_[i].free_event >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("id %d is freed twice", id));
  }
  allocations_[i].free_event = static_cast<std::int64_t>(events_.size());
  Event e;
  e.kind = Kind::kFree;
  e.allocation = i;
  events_.push_back(e);
  return absl::OkStatus();
}

namespace {

// Next-use values besides event indices.
constexpr std::int64_t kDead = -1;  // not needed after this use
// Kept past its last use without a next use (persistent, the step alone):
// farther than any use, so such data leaves first.
constexpr std::int64_t kKept = std::numeric_limits<std::int64_t>::max();

// For each access, the event of the same allocation's next use: an event
// index, or (repeat, persistent) events().size() + its first use in the
// next step, or kKept, or kDead.
std::vector<std::int64_t> NextUses(const Step& step, bool repeat) {
  const auto& allocs = step.allocations();
  const auto& events = step.events();
  const std::int64_t n = static_cast<std::int64_t>(events.size());
  std::vector<std::int64_t> next_seen(allocs.size());
  for (std::size_t a = 0; a < allocs.size(); ++a) {
    if (!allocs[a].persistent()) {
      next_seen[a] = kDead;
    } else {
      next_seen[a] = repeat ? n + allocs[a].first_use : kKept;
    }
  }
  std::vector<std::int64_t> next(step.accesses().size(), kDead);
  for (std::int64_t e = n - 1; e >= 0; --e) {
    if (events[e].kind != Step::Kind::kUse) continue;
    for (std::int64_t k = events[e].access_begin; k < events[e].access_end; ++k) {
      const std::int32_t a = step.accesses()[k].allocation;
      next[k] = next_seen[a];
      next_seen[a] = e;
    }
  }
  return next;
}

// The order in which resident data leaves: the farthest next use first,
// then the larger, then the clean one (it costs no write-back).
struct VictimKey {
  std::int64_t next_use;
  std::size_t bytes;
  bool dirty;
  std::int32_t allocation;
  bool operator<(const VictimKey& o) const {
    if (next_use != o.next_use) return next_use > o.next_use;
    if (bytes != o.bytes) return bytes > o.bytes;
    if (dirty != o.dirty) return !dirty;
    return allocation < o.allocation;
  }
};

// Persistent data resident between two steps: (allocation, dirty), sorted.
using Boundary = std::vector<std::pair<std::int32_t, bool>>;

struct StepRun {
  LinkBytes bytes;
  Boundary end;
  std::size_t peak_resident = 0;
};

// One step of the heuristic from `start`.
StepRun RunStep(const Step& step, const std::vector<std::int64_t>& next_uses,
                const ScheduleOptions& options, const Boundary& start,
                std::vector<ScheduleMove>* moves) {
  const auto& allocs = step.allocations();
  const auto& events = step.events();
  const auto& accesses = step.accesses();
  struct State {
    bool resident = false;
    bool dirty = false;     // the device's copy is the only valid one
    bool has_data = false;  // carried, or created by a use
    std::int64_t next_use = kDead;
  };
  std::vector<State> state(allocs.size());
  for (std::size_t a = 0; a < allocs.size(); ++a) state[a].has_data = allocs[a].carried;
  absl::btree_set<VictimKey> resident;
  std::uint64_t resident_bytes = 0;
  auto key = [&](std::int32_t a) {
    return VictimKey{state[a].next_use, allocs[a].bytes, state[a].dirty, a};
  };
  for (const auto& [a, dirty] : start) {
    state[a] = {true, dirty, true, allocs[a].first_use};
    resident.insert(key(a));
    resident_bytes += allocs[a].bytes;
  }
  StepRun run;
  run.peak_resident = resident_bytes;
  auto leave = [&](std::int32_t a) {
    resident.erase(key(a));
    state[a].resident = false;
    resident_bytes -= allocs[a].bytes;
  };
  for (std::int64_t e = 0; e < static_cast<std::int64_t>(events.size()); ++e) {
    const Step::Event& ev = events[e];
    if (ev.kind == Step::Kind::kAlloc) continue;
    if (ev.kind == Step::Kind::kFree) {
      if (state[ev.allocation].resident) leave(ev.allocation);
      continue;
    }
    // The kernel's resident allocations cannot be victims: out of the set
    // while room is made (their bytes stay counted).
    std::uint64_t need = 0;
    for (std::int64_t k = ev.access_begin; k < ev.access_end; ++k) {
      const std::int32_t a = accesses[k].allocation;
      if (state[a].resident) {
        resident.erase(key(a));
      } else {
        need += allocs[a].bytes;
      }
    }
    while (resident_bytes + need > options.device_bytes) {
      // The caller checked that each kernel fits, so a victim exists.
      if (resident.empty()) std::abort();
      const VictimKey victim = *resident.begin();
      const std::int32_t a = victim.allocation;
      ScheduleMove m{ScheduleMove::Kind::kDrop, e, allocs[a].id, allocs[a].bytes};
      if (state[a].dirty) {
        m.kind = ScheduleMove::Kind::kWriteBack;
        run.bytes.d2h += allocs[a].bytes;
        state[a].dirty = false;
      }
      if (moves != nullptr) moves->push_back(m);
      resident.erase(resident.begin());
      state[a].resident = false;
      resident_bytes -= allocs[a].bytes;
    }
    for (std::int64_t k = ev.access_begin; k < ev.access_end; ++k) {
      const std::int32_t a = accesses[k].allocation;
      State& s = state[a];
      if (!s.resident) {
        if (s.has_data) {  // its valid copy is on the host
          run.bytes.h2d += allocs[a].bytes;
          if (moves != nullptr) {
            moves->push_back({ScheduleMove::Kind::kFetch, e, allocs[a].id, allocs[a].bytes});
          }
        } else {  // created here: its data exists on the device only
          s.has_data = true;
          s.dirty = true;
        }
        s.resident = true;
        resident_bytes += allocs[a].bytes;
      }
      if (accesses[k].writes) s.dirty = true;
    }
    run.peak_resident = std::max<std::size_t>(run.peak_resident, resident_bytes);
    for (std::int64_t k = ev.access_begin; k < ev.access_end; ++k) {
      const std::int32_t a = accesses[k].allocation;
      state[a].next_use = next_uses[k];
      if (next_uses[k] == kDead) {
        state[a].resident = false;  // dead: dropped for nothing
        resident_bytes -= allocs[a].bytes;
      } else {
        resident.insert(key(a));
      }
    }
  }
  if (options.repeat) {
    for (std::size_t a = 0; a < allocs.size(); ++a) {
      // Everything else resident was dropped at its last use or its free.
      if (state[a].resident) run.end.push_back({static_cast<std::int32_t>(a), state[a].dirty});
    }
  }
  return run;
}

}  // namespace

absl::StatusOr<OfflineSchedule> PlanOfflineSchedule(const Step& step,
                                                    const ScheduleOptions& options) {
  const auto& events = step.events();
  for (std::size_t e = 0; e < events.size(); ++e) {
    if (events[e].kind != Step::Kind::kUse) continue;
    std::uint64_t w = 0;
    for (std::int64_t k = events[e].access_begin; k < events[e].access_end; ++k) {
      w += step.allocations()[step.accesses()[k].allocation].bytes;
    }
    if (w > options.device_bytes) {
      return absl::FailedPreconditionError(
          absl::StrFormat("the kernel at event %d needs %s at once; the device part is %s", e,
                          Bytes(w), Bytes(options.device_bytes)));
    }
  }
  const std::vector<std::int64_t> next_uses = NextUses(step, options.repeat);
  OfflineSchedule out;
  for (const Step::Allocation& a : step.allocations()) {
    if (a.first_use < 0) out.never_resident.push_back(a.id);
  }
  std::vector<ScheduleMove>* moves = options.record_moves ? &out.moves : nullptr;
  if (!options.repeat) {
    StepRun run = RunStep(step, next_uses, options, {}, moves);
    out.bytes = run.bytes;
    out.peak_resident = run.peak_resident;
    return out;
  }
  // From a cold start, step until a boundary state comes back: the steps
  // from its first appearance on form a cycle that repeats forever, a
  // feasible steady state (the heuristic is deterministic).
  const int max_steps = std::max(2, options.max_steps);
  std::vector<Boundary> starts = {Boundary{}};
  std::vector<LinkBytes> per_step;
  std::map<Boundary, int> seen = {{Boundary{}, 0}};
  int cycle_begin = -1;
  for (int k = 0; k < max_steps; ++k) {
    StepRun run = RunStep(step, next_uses, options, starts[k], nullptr);
    per_step.push_back(run.bytes);
    auto [it, inserted] = seen.emplace(run.end, k + 1);
    if (!inserted) {
      cycle_begin = it->second;
      break;
    }
    starts.push_back(std::move(run.end));
  }
  int first = cycle_begin;
  int last = static_cast<int>(per_step.size());  // exclusive
  out.steady = cycle_begin >= 0;
  if (!out.steady) first = last - max_steps / 2;
  for (int k = first; k < last; ++k) {
    out.bytes.h2d += per_step[k].h2d;
    out.bytes.d2h += per_step[k].d2h;
  }
  out.steps = last - first;
  // The cycle's first step again, for its moves and its peak.
  StepRun again = RunStep(step, next_uses, options, starts[first], moves);
  out.peak_resident = again.peak_resident;
  return out;
}

}  // namespace cma
