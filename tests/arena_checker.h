// ArenaChecker: a randomized differential test of CachingManagedAllocator on
// the host backend, with a shadow model of every stream's outstanding work.
//
// A step language (alloc, free, work/complete on a stream, record_stream,
// empty_cache, memory fraction, move, mark disposable, sleep, wake, forget
// and destroy a stream, begin/end allocating to a private pool, release a
// pool; with `pool_checkpoints`, also take and restore a pool's checkpoint,
// as torch.compile's cudagraph trees do; each new allocation is touched by its "kernel", which populates
// pages the allocator did not prefetch) is driven by a StepSource: a seeded generator in the
// test suite, the fuzzer's bytes in fuzz/. After every step the checker
// asserts:
//  * the allocator's own CheckInvariants, and no backend call it made failed;
//  * reserved bytes equal the bytes the backend itself holds populated
//    (while awake);
//  * no block is handed out over a live allocation, or while another stream
//    may still use it (its last use there has not completed);
//  * no page is discarded under a live allocation (except what Sleep and a
//    contents-dead Move may discard: disposable allocations, at level 2 all
//    not marked keep, and those whose pages a Sleep has copied into its
//    staging first, after their streams' work) or before another stream's last use of
//    it completed, and no page is populated by one stream before another
//    stream's discard of it has run or been waited for;
//  * a live block's pages are on the device it was allocated for;
//  * a block freed into a private pool is handed out to no other pool and
//    not to the shared cache while the pool lives; while a pool is being
//    allocated to, sleep, wake, empty_cache, forget and move are refused;
//  * the tag written into each allocation is intact when it is freed, after
//    every Wake and after a Move (the host backend zero-fills discarded
//    pages, as a GPU loses them, and copies through staging for real): data
//    survives sleep and wake bit-exactly, at every level, except what that
//    level may discard; a staged allocation freed while asleep is exempt.
//  * a checkpoint lists exactly the pool's live allocations; a restore
//    reports the pool's live allocations freed and the checkpoint's created,
//    re-creates none over a live allocation, another pool's free space or
//    memory another stream may still use, and a refused one leaves the
//    pool's allocations as they were; a restore right after the take keeps
//    everything in place.
//
// Thread safety: one checker per thread; it owns its backend and allocator.
// Errors: Step and Finish return kFailedPrecondition naming the violated
// rule and the step; log() has the recent steps to reproduce it.
#ifndef CMA_TESTS_ARENA_CHECKER_H_
#define CMA_TESTS_ARENA_CHECKER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/host/host_backend.h"

namespace cma {

// Where the checker's choices come from.
class StepSource {
 public:
  virtual ~StepSource() = default;
  // A number in [0, bound); bound > 0.
  virtual std::uint32_t Next(std::uint32_t bound) = 0;
};

class SeededSource final : public StepSource {
 public:
  explicit SeededSource(std::uint64_t seed) : rng_(seed) {}
  std::uint32_t Next(std::uint32_t bound) override {
    return static_cast<std::uint32_t>(rng_() % bound);
  }

 private:
  std::mt19937_64 rng_;
};

// Reads the choices from a byte string (libFuzzer's input); zeros past its end.
class ByteSource final : public StepSource {
 public:
  ByteSource(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::uint32_t Next(std::uint32_t bound) override;
  bool exhausted() const { return n_ == 0; }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

class ArenaChecker {
 public:
  // `config` is CMA_ALLOC_CONF text; the emulated device has `capacity` bytes.
  // `pool_checkpoints` adds the checkpoint steps (and more pool steps); off,
  // the step language is the one the fuzzer's corpus was recorded in.
  // `away_steps` adds SendAway and BringBack steps (arena_checker_away.cc).
  static absl::StatusOr<std::unique_ptr<ArenaChecker>> Create(absl::string_view config,
                                                              std::size_t capacity,
                                                              bool pool_checkpoints = false,
                                                              bool away_steps = false,
                                                              int busy_query_percent = 0);
  ~ArenaChecker();

  // One random step and every check after it.
  absl::Status Step(StepSource& in);
  // Frees everything (checking each tag), completes all work, empties the
  // cache, and checks that nothing stays populated or leaks.
  absl::Status Finish();
  // The most recent steps, one per line.
  std::string log() const;
  int steps() const { return steps_; }

 private:
  struct Live {
    std::size_t size;
    Stream stream;
    std::vector<Stream> uses;  // RecordStream
    std::uint64_t tag;
    bool disposable = false;
    bool dead = false;  // contents legitimately thrown away
    bool away = false;  // moved off its device or asleep
    bool keep = false;  // survives a level-2 sleep
    // A Sleep copied its whole pages out (copied), then discarded them
    // (staged): its contents are in the staging until Wake or Move copies
    // them back.
    bool copied = false;
    bool staged = false;
    bool restored = false;  // copied back by the calls being checked
    std::uint32_t pool = 0;  // the private pool it was allocated for (0: shared)
  };
  struct Use {  // a freed block's last use by one stream
    std::uintptr_t lo, hi;
    Stream stream;
    std::int64_t ticket;
  };
  struct PendingDiscard {
    std::uintptr_t lo, hi;
    Stream stream;
    std::int64_t ticket;
  };

  static constexpr int kStreams = 3;  // created streams; the default stream is a fourth
  ArenaChecker() = default;
  absl::Status Violation(absl::string_view what) const;
  void Note(std::string line);

  absl::Status DoAlloc(StepSource& in);
  absl::Status DoFree(std::uintptr_t p);
  absl::Status DoMove(StepSource& in);
  // SendAway or BringBack of a random live allocation (arena_checker_away.cc).
  absl::Status DoAway(StepSource& in);
  // The populated pages inside away allocations (none of the device's).
  // A page of one on the device is a violation (nothing here touches them).
  absl::StatusOr<std::size_t> AwayPagesHeld() const;
  // Whether the allocation at `p` is away (the allocator's snapshot says).
  bool IsAway(std::uintptr_t p) const;
  absl::Status DoSleep(Stream s, SleepLevel level);
  absl::Status DoForget(StepSource& in);
  // Refused while a staged allocation is live; else gives all of it back.
  absl::Status DoReleaseStaging();
  absl::Status DoPoolStep(StepSource& in);
  // Takes pool `pool`'s checkpoint (and, by `in`'s choice, restores it at once).
  absl::Status DoTakeCheckpoint(StepSource& in, std::uint32_t pool);
  absl::Status DoRestoreCheckpoint(std::uint32_t pool);
  // OK when `s` is the refusal a call gets while a pool is allocated to.
  absl::Status ExpectRefused(const absl::Status& s, const char* what);
  // The pool an allocation on `s` goes to now (the latest context whose
  // filter takes it), as the allocator must route it.
  std::uint32_t Route(Stream s) const;
  // Forgets the free ranges of released pools (no reference, not being
  // allocated to), whose free memory may be given back.
  void ForgetDissolvedPools();
  absl::Status AfterStep();

  // Whether work on `s` is ordered after `on` reaching `ticket`: the same
  // stream, completed already, or a GPU-side wait for it.
  bool Ordered(Stream s, Stream on, std::int64_t ticket);
  bool Completed(Stream on, std::int64_t ticket);
  std::int64_t Submitted(Stream s);
  // Checks the backend calls made since the last step, in order.
  absl::Status CheckCalls();
  void AddWait(const StreamWaitRecord& w);
  absl::Status CheckDiscard(std::uintptr_t lo, std::uintptr_t hi, Stream x, std::int64_t ticket,
                            bool then_populate);
  absl::Status CheckPopulation(std::uintptr_t lo, std::uintptr_t hi, Stream s);
  // A copy from `src` to `dst` on stream x: out of a live allocation only
  // during a Sleep and after its streams' work; into one, only after the
  // discards it follows.
  absl::Status CheckCopy(const PlacementRecord& r);
  // Every live allocation that is not dead or staged still holds its tag.
  absl::Status CheckTags() const;
  void Prune();
  // With prefetch on allocation in an arena, the whole pages of a live
  // allocation (or of every one) that is not away are on device 0.
  absl::Status CheckResident(std::uintptr_t p, std::size_t size) const;
  absl::Status CheckResident() const;
  void WriteTag(std::uintptr_t p, const Live& l);
  bool TagIntact(std::uintptr_t p, const Live& l) const;
  Stream PickStream(StepSource& in) const;
  std::uintptr_t PickLive(StepSource& in) const;

  std::unique_ptr<HostBackend> backend_;
  std::unique_ptr<CachingManagedAllocator> alloc_;
  bool check_placement_ = false;  // arena mode with prefetch on allocation
  std::size_t capacity_ = 0;
  std::vector<Stream> streams_;
  std::map<std::uintptr_t, Live> live_;
  std::vector<Use> retired_;
  std::vector<PendingDiscard> discards_;
  absl::flat_hash_map<std::pair<Stream, Stream>, std::int64_t> waited_;
  // A step that may discard live allocations: which (Sleep and Wake: the
  // disposable ones, Sleep only after their streams' work; a contents-dead
  // Move: the moved one).
  enum class Discarding { kNone, kSleep, kWake };
  Discarding discarding_ = Discarding::kNone;
  SleepLevel sleep_level_ = SleepLevel::kOffload;  // of the Sleep under way
  std::uintptr_t dead_move_ = 0;
  absl::flat_hash_map<Stream, std::int64_t> submitted_at_sleep_;
  // Private pools: open contexts (pool, the one stream its filter takes, or
  // kDefaultStream meaning every stream), references, and the ranges freed
  // into each pool that no other pool and not the shared cache may get.
  struct Context {
    std::uint32_t pool;
    Stream only;
    bool all;
    bool capture = true;  // else begun not_a_capture: the allocator stays active
  };
  std::vector<Context> contexts_;
  // Whether the allocator is quiet: a capture's context is open (the model
  // says so, and AfterStep checks the allocator agrees), or a pool the
  // allocator still knows as captured was taken again after its release.
  bool Quiet() const;
  bool CaptureOpen() const;
  std::map<std::uint32_t, int> pool_refs_;
  // Pools a capture's context has allocated to since they were last
  // released: every later context of theirs is a capture's too.
  std::set<std::uint32_t> captured_;
  std::map<std::uint32_t, std::vector<std::pair<std::uintptr_t, std::uintptr_t>>> pool_free_;
  // No reference and no context: no graph replays into the pool's free
  // ranges any more, and its wholly free segments may be given back (and
  // their addresses handed out again), as PyTorch frees a released pool's.
  bool Released(std::uint32_t pool) const;
  bool pool_checkpoints_ = false;
  bool away_steps_ = false;
  std::map<std::uint32_t, PoolCheckpoint> checkpoints_;  // the latest taken, per pool
  bool asleep_ = false;
  std::uint64_t next_tag_ = 1;
  int steps_ = 0;
  std::deque<std::string> log_;
};

}  // namespace cma

#endif  // CMA_TESTS_ARENA_CHECKER_H_
