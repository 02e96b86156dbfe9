// The learned step against the link's limit, on the host backend (issue 48):
// a recorded step (bench/step_file.h) is replayed, step after step, through
// a CachingManagedAllocator with learn_step:1 whose device part is a
// fraction of the step's live peak, and the bytes the core moved each step
// are set beside the replay policy's own plan (policy/replay_schedule.h)
// and the lower bound no schedule beats (policy/offline_schedule.h).
// Nothing is timed: the host backend counts pages and transfers, so this
// measures what crosses the link, where it goes and when the plan breaks,
// in seconds instead of GPU minutes; the GPU benchmark measures the time.
//
//   learn_replay --step=step.csv.gz [--fractions=0.6667,0.3333] [--steps=6]
//                [--conf=oversubscribe:1,learn_step:1] [--state_after=0.85] [--json=out.json]
//                [--check_data]
//
// --check_data stamps every allocation (its first and last 8 bytes and the
// first 8 of each 2 MiB page inside it) when it is made and at each use,
// and checks the stamps at each use and before each free: the host
// backend zeroes what a discard drops, so a discard that reaches live data
// shows (issue order only: the host backend runs every call at once).
//
// The step's allocations are made as the file says; carried allocations the
// step frees come back, in the next step, as the ones the step made and
// left live (matched by size, in order), as a framework's would.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/host/host_backend.h"
#include "bench/step_file.h"
#include "nlohmann/json.hpp"
#include "policy/offline_schedule.h"
#include "policy/replay_schedule.h"

ABSL_FLAG(std::string, step, "", "the recorded step (bench/step_file.h; .gz read as such)");
ABSL_FLAG(std::string, fractions, "0.6667,0.3333",
          "device parts as fractions of the step's live peak (1/1.5 and 1/3: the GPU bench's "
          "ratios 1.5 and 3)");
ABSL_FLAG(int, steps, 6, "steps replayed per device part (the first records, then plans)");
ABSL_FLAG(std::string, conf, "oversubscribe:1,learn_step:1",
          "the allocator's config; managed_budget and device_headroom are added");
ABSL_FLAG(std::string, json, "", "write the per-step figures here as JSON");
ABSL_FLAG(bool, check_data, false,
          "stamp allocations and check the stamps at every use and free (see above)");
ABSL_FLAG(double, state_after, 0.85,
          "carried allocations that live through the step and are first used after this "
          "fraction of its events (the optimizer's state: the step ends with the optimizer) are "
          "made in a host-tier context, as cma.torch's oversubscription routes optimizer "
          "state; 0: none");

namespace cma {
namespace {

using Json = nlohmann::json;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kHeadroom = std::size_t{512} << 20;

int Fail(const std::string& message) {
  std::fprintf(stderr, "learn_replay: %s\n", message.c_str());
  return 2;
}

double GB(double bytes) { return bytes / 1e9; }

// What the core did in one step, from the stats' differences.
struct StepFigures {
  std::int64_t sent = 0, brought = 0;      // SendAway / BringBack
  std::int64_t to_device = 0, to_host = 0;  // every prefetch either way
  std::int64_t host_overflow = 0;           // bytes placed on the host tier
  std::int64_t host_resident = 0;           // host tier's bytes at the end
  std::int64_t away = 0;                    // away at the end
  std::int64_t plans = 0, divergences = 0, misses = 0;
  std::int64_t failed_allocations = 0;
  std::int64_t data_errors = 0;  // --check_data: stamps found changed
};

// --check_data's stamps: where they go in an allocation of `bytes` at `p`.
template <typename Fn>
void ForEachStamp(void* p, std::size_t bytes, Fn&& fn) {
  constexpr std::uintptr_t kPage = std::uintptr_t{2} << 20;
  if (bytes < sizeof(std::uint64_t)) return;
  const auto lo = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t hi = lo + bytes - sizeof(std::uint64_t);
  fn(reinterpret_cast<std::uint64_t*>(lo));
  for (std::uintptr_t a = (lo / kPage + 1) * kPage; a < hi; a += kPage) {
    fn(reinterpret_cast<std::uint64_t*>(a));
  }
  if (hi != lo) fn(reinterpret_cast<std::uint64_t*>(hi));
}

void Stamp(void* p, std::size_t bytes, std::uint64_t tag) {
  ForEachStamp(p, bytes, [tag](std::uint64_t* w) { *w = tag; });
}

// The number of stamps that are not `tag`.
std::int64_t CheckStamp(void* p, std::size_t bytes, std::uint64_t tag) {
  std::int64_t bad = 0;
  ForEachStamp(p, bytes, [&](std::uint64_t* w) { bad += *w != tag; });
  return bad;
}

// Replays the step `steps` times under a device part of `part` bytes.
absl::StatusOr<std::vector<StepFigures>> Replay(const Step& step, std::size_t part, int steps,
                                                const std::string& conf, double state_after,
                                                bool check_data) {
  HostBackendOptions o;
  o.device_count = 1;
  o.device_capacity = part + kHeadroom;
  o.host_available = std::size_t{512} * kGiB;
  o.host_total = std::size_t{512} * kGiB;
  HostBackend backend(o);
  const std::string config = absl::StrFormat(
      "%s,device_headroom:%dM,managed_budget:%dG", conf, kHeadroom >> 20,
      (part + kHeadroom) / kGiB + 128);
  absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> made =
      CachingManagedAllocator::Create(backend, config);
  if (!made.ok()) return made.status();
  CachingManagedAllocator& alloc = **made;
  absl::StatusOr<Stream> stream = backend.CreateStream(0);
  if (!stream.ok()) return stream.status();

  const auto& allocs = step.allocations();
  std::vector<void*> ptr(allocs.size(), nullptr);
  std::vector<std::uint64_t> tag(allocs.size(), 0);  // --check_data: each one's stamp
  std::uint64_t next_tag = 1;
  std::int64_t reported = 0;
  auto stamp = [&](std::size_t i) {
    if (!check_data || ptr[i] == nullptr) return;
    tag[i] = next_tag++;
    Stamp(ptr[i], allocs[i].bytes, tag[i]);
  };
  // Returns the stamps found changed (and names the first few).
  auto check = [&](std::size_t i, int k, const char* when) -> std::int64_t {
    if (!check_data || ptr[i] == nullptr) return 0;
    const std::int64_t bad = CheckStamp(ptr[i], allocs[i].bytes, tag[i]);
    if (bad != 0 && reported++ < 10) {
      std::fprintf(stderr,
                   "learn_replay: step %d: allocation %zu (%zu bytes at %p) lost %lld stamp(s), "
                   "found %s\n",
                   k + 1, i, static_cast<std::size_t>(allocs[i].bytes), ptr[i],
                   static_cast<long long>(bad), when);
    }
    return bad;
  };
  // Carried allocations the step frees, by size: the next step's carried
  // ones are what this step made and left live.
  std::vector<std::int32_t> carried_freed;
  const auto state_from = static_cast<std::int64_t>(state_after * step.events().size());
  for (std::size_t i = 0; i < allocs.size(); ++i) {
    if (!allocs[i].carried) continue;
    const bool state =
        state_after > 0 && allocs[i].persistent() && allocs[i].first_use >= state_from;
    if (state) (void)alloc.SetHostRouting(0, true);
    absl::StatusOr<void*> p = alloc.Allocate(allocs[i].bytes, 0, *stream);
    if (state) (void)alloc.SetHostRouting(0, false);
    if (!p.ok()) return p.status();
    ptr[i] = *p;
    stamp(i);
    if (allocs[i].free_event >= 0) carried_freed.push_back(static_cast<std::int32_t>(i));
  }
  if (absl::Status s = alloc.MarkIteration(0); !s.ok()) return s;

  std::vector<StepFigures> out;
  DeviceStats before = *alloc.GetStats(0);
  std::vector<void*> uses;
  for (int k = 0; k < steps; ++k) {
    StepFigures f;
    for (const Step::Event& e : step.events()) {
      switch (e.kind) {
        case Step::Kind::kAlloc: {
          absl::StatusOr<void*> p = alloc.Allocate(allocs[e.allocation].bytes, 0, *stream);
          if (!p.ok()) {
            ++f.failed_allocations;
            ptr[e.allocation] = nullptr;
          } else {
            ptr[e.allocation] = *p;
            stamp(e.allocation);
          }
          break;
        }
        case Step::Kind::kFree:
          if (ptr[e.allocation] != nullptr) {
            f.data_errors += check(e.allocation, k, "before its free");
            if (absl::Status s = alloc.Free(ptr[e.allocation]); !s.ok()) return s;
          }
          ptr[e.allocation] = nullptr;
          break;
        case Step::Kind::kUse: {
          uses.clear();
          for (std::int64_t a = e.access_begin; a < e.access_end; ++a) {
            void* p = ptr[step.accesses()[a].allocation];
            if (p != nullptr) uses.push_back(p);
          }
          if (absl::Status s = alloc.NoteUses(0, uses, *stream); !s.ok()) return s;
          // What the use's kernel reads, then writes.
          for (std::int64_t a = e.access_begin; a < e.access_end; ++a) {
            const std::size_t i = step.accesses()[a].allocation;
            f.data_errors += check(i, k, "at a use");
            stamp(i);
          }
          break;
        }
      }
    }
    // Made in the step and still live: the next step's carried-and-freed.
    std::vector<std::int32_t> left;
    for (std::size_t i = 0; i < allocs.size(); ++i) {
      if (!allocs[i].carried && allocs[i].free_event < 0 && ptr[i] != nullptr) {
        left.push_back(static_cast<std::int32_t>(i));
      }
    }
    auto by_size = [&](std::int32_t a, std::int32_t b) {
      return allocs[a].bytes != allocs[b].bytes ? allocs[a].bytes < allocs[b].bytes : a < b;
    };
    std::sort(left.begin(), left.end(), by_size);
    std::vector<std::int32_t> want = carried_freed;
    std::sort(want.begin(), want.end(), by_size);
    std::size_t j = 0;
    for (std::int32_t w : want) {
      while (j < left.size() && allocs[left[j]].bytes < allocs[w].bytes) {
        (void)alloc.Free(ptr[left[j]]);  // left over, and no carried one of its size
        ptr[left[j++]] = nullptr;
      }
      if (j < left.size() && allocs[left[j]].bytes == allocs[w].bytes) {
        ptr[w] = ptr[left[j]];
        tag[w] = tag[left[j]];
        ptr[left[j++]] = nullptr;
      } else {  // none of its size left live: made anew
        absl::StatusOr<void*> p = alloc.Allocate(allocs[w].bytes, 0, *stream);
        if (!p.ok()) return p.status();
        ptr[w] = *p;
        stamp(w);
      }
    }
    for (; j < left.size(); ++j) {
      (void)alloc.Free(ptr[left[j]]);
      ptr[left[j]] = nullptr;
    }
    if (absl::Status s = alloc.MarkIteration(0); !s.ok()) return s;
    if (absl::Status s = backend.SynchronizeStream(*stream); !s.ok()) return s;
    const DeviceStats now = *alloc.GetStats(0);
    f.sent = now.sent_away_bytes - before.sent_away_bytes;
    f.brought = now.brought_back_bytes - before.brought_back_bytes;
    f.to_device = now.prefetched_bytes_to_device - before.prefetched_bytes_to_device;
    f.to_host = now.prefetched_bytes_to_host - before.prefetched_bytes_to_host;
    f.host_overflow = now.host_overflow_bytes - before.host_overflow_bytes;
    f.host_resident = now.host_resident_bytes[kAllPools].current;
    f.away = now.away_bytes[kAllPools].current;
    f.plans = now.learned_plans - before.learned_plans;
    f.divergences = now.learned_divergences - before.learned_divergences;
    f.misses = now.learned_misses - before.learned_misses;
    out.push_back(f);
    before = now;
  }
  for (std::size_t i = 0; i < ptr.size(); ++i) {
    if (ptr[i] != nullptr) (void)alloc.Free(ptr[i]);
  }
  return out;
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_step);
  if (path.empty()) return Fail("--step is required");
  absl::StatusOr<StepFile> file = ReadStepFile(path);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  const Step& step = file->step;
  const StepFacts facts = MeasureStep(step, /*repeat=*/true);
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2) return Fail("--steps must be at least 2 (one records, the next replays)");

  Json json = {{"step", path}, {"live_peak", facts.live_peak}, {"parts", Json::array()}};
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_fractions), ',')) {
    double fraction;
    if (!absl::SimpleAtod(text, &fraction) || !(fraction > 0)) {
      return Fail(absl::StrFormat("--fractions: bad number '%s'", text));
    }
    const auto part = static_cast<std::size_t>(fraction * static_cast<double>(facts.live_peak));
    ScheduleOptions so;
    so.device_bytes = part;
    so.repeat = true;
    so.record_moves = false;
    absl::StatusOr<LinkLowerBound> bound = LowerBoundLinkBytes(step, so);
    ReplayPlanOptions ro;
    ro.device_bytes = part - part / 16;  // as allocator/learn_step.cc plans
    ro.max_lead_events = 512;
    absl::StatusOr<ReplayPlan> plan = PlanReplay(step, ro);
    std::printf("device part %.2f GiB (%.4g of the live peak %.2f GiB)\n",
                static_cast<double>(part) / kGiB, fraction,
                static_cast<double>(facts.live_peak) / kGiB);
    Json pj = {{"fraction", fraction}, {"device_bytes", part}, {"steps", Json::array()}};
    if (bound.ok()) {
      std::printf("  lower bound: H2D %.2f GB, D2H %.2f GB a step\n", GB(bound->h2d),
                  GB(bound->d2h));
      pj["bound"] = {{"h2d", bound->h2d}, {"d2h", bound->d2h}};
    } else {
      std::printf("  lower bound: %s\n", std::string(bound.status().message()).c_str());
    }
    if (plan.ok()) {
      std::printf("  policy's plan (15/16 of the part, whole allocations movable): H2D %.2f GB, "
                  "D2H %.2f GB, %zu actions\n",
                  GB(plan->bytes.h2d), GB(plan->bytes.d2h), plan->actions.size());
      pj["plan"] = {{"h2d", plan->bytes.h2d}, {"d2h", plan->bytes.d2h}};
    } else {
      std::printf("  policy's plan: %s\n", std::string(plan.status().message()).c_str());
    }
    absl::StatusOr<std::vector<StepFigures>> figs =
        Replay(step, part, steps, absl::GetFlag(FLAGS_conf), absl::GetFlag(FLAGS_state_after),
               absl::GetFlag(FLAGS_check_data));
    if (!figs.ok()) return Fail(std::string(figs.status().message()));
    std::printf("  %4s %9s %9s %9s %9s %9s %9s %9s %5s %5s %6s %6s %6s\n", "step", "sent GB",
                "back GB", "H2D GB", "D2H GB", "host+ GB", "host GB", "away GB", "plans", "div",
                "misses", "failed", "data!");
    for (std::size_t k = 0; k < figs->size(); ++k) {
      const StepFigures& f = (*figs)[k];
      std::printf("  %4zu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %5lld %5lld %6lld %6lld %6lld\n",
                  k + 1, GB(f.sent), GB(f.brought), GB(f.to_device), GB(f.to_host),
                  GB(f.host_overflow), GB(f.host_resident), GB(f.away),
                  static_cast<long long>(f.plans), static_cast<long long>(f.divergences),
                  static_cast<long long>(f.misses), static_cast<long long>(f.failed_allocations),
                  static_cast<long long>(f.data_errors));
      pj["steps"].push_back({{"sent", f.sent},
                             {"brought", f.brought},
                             {"h2d", f.to_device},
                             {"d2h", f.to_host},
                             {"host_overflow", f.host_overflow},
                             {"host_resident", f.host_resident},
                             {"away", f.away},
                             {"plans", f.plans},
                             {"divergences", f.divergences},
                             {"misses", f.misses},
                             {"failed_allocations", f.failed_allocations},
                             {"data_errors", f.data_errors}});
    }
    json["parts"].push_back(pj);
  }
  if (const std::string out = absl::GetFlag(FLAGS_json); !out.empty()) {
    std::ofstream(out) << json.dump(1) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace cma

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cma::Run();
}
