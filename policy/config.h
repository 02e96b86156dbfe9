// AllocatorConfig: every tunable of the allocator, parsed from one string in
// the form `key:value,key:value` (the CMA_ALLOC_CONF environment variable, or
// the same string passed through the API).
//
// Keys shared with PyTorch's PYTORCH_CUDA_ALLOC_CONF keep PyTorch's meaning:
//   max_split_size_mb            blocks at least this large are never split
//   roundup_power2_divisions     round sizes to 1/N steps of their power of two
//                                (N, or PyTorch's per-interval [MiB:N,...,>:N];
//                                policy/roundup_divisions.h)
//   garbage_collection_threshold fraction of the budget above which idle
//                                cached blocks are released before growing
// This library's own keys:
//   prefetch            none | on_alloc | on_move       (default on_alloc)
//   preferred_location  none | device | host            (default none)
//   accessed_by         none | all | D[+D...]           (default none)
//   discard_on_free     0 | 1                            (default 0)
//   managed_budget      fraction in (0,1] of the device's free memory at
//                       its first use, or an absolute size such as 8G
//                       (default 1.0)
//   release_threshold   size (e.g. 512M) of idle cache kept after frees;
//                       above it fully-free segments go back (default: all kept)
//   release_before_peak 0 | 1: give idle cached segments back rather than
//                       raise the high-water mark of reserved memory (default
//                       0: it trades backend calls and stream syncs in the
//                       steady state for less reserved memory)
//   multicast           0 | 1: symmetric mode may use multicast (default 0)
//   segments            arena | classic (default arena). arena: blocks are
//                       carved from large managed address ranges whose 2 MiB
//                       pages are populated when first handed out and
//                       discarded (stream-ordered) when wholly free and
//                       needed elsewhere, so reserved_bytes counts populated
//                       pages. classic: PyTorch-like 2 MiB / 20 MiB segments.
//   idle_page_slack     arena mode: off (default) | a fraction F. off: idle
//                       populated pages are discarded only under pressure
//                       (the budget, garbage_collection_threshold,
//                       release_threshold, empty_cache), so the steady state
//                       makes no driver call. F: populated pages may exceed
//                       the peak of pages in use by F of it (at least 4
//                       pages) before new pages replace idle ones by
//                       discarding them; 0 keeps strictly to the peak. A
//                       discarded page is reclaimable by the driver (cudaMalloc
//                       can take it) but cudaMemGetInfo does not show it free.
//   arena_size          size of each arena's address range (default 0: the
//                       managed budget, so one arena never spans more than
//                       the device had free)
//   sleep_staging_max   none (default) | a size: the most pinned host memory
//                       a device's Sleep keeps for staging (allocator/
//                       staging.h). It is held while awake, so that every
//                       later cycle copies at the link's speed, until
//                       ReleaseSleepStaging; allocations that do not fit
//                       migrate instead. 0: every Sleep migrates.
//   sleep_pin_threads   1-64 (default 8): how many staging chunks a first
//                       Sleep pins at once (allocator/chunk_pinner.h); 1 pins
//                       one after another.
//   wake_fence          0|1 (default 1): a Wake (or a Move of a sleeping
//                       allocation) populates only after the driver's work
//                       behind the Sleep's discards, waited for on the GPU
//                       (allocator/discard_fence.h says why).
//   oversubscribe       0|1 (default 0): work larger than the device
//                       (policy/oversubscription.h). The managed budget is
//                       then the total, device plus host (default: the
//                       device's free memory plus half the host's
//                       available memory); allocations beyond the device's
//                       part live on the host, read and written by the GPU
//                       over the link, so nothing migrates on faults. Needs
//                       segments:arena. Off, a budget above the device's
//                       free memory leaves placement to the driver.
//   host_plan           0|1 (default 0): with oversubscribe:1, each iteration
//                       marked by MarkIteration plans the next one's host
//                       placements (policy/host_plan.h) rather than leaving
//                       them to allocation order. Measured on GPT-2 style
//                       training (bench/results/h200_oversub): faster at 3x
//                       oversubscription, slower at 1.5x (it moves long-lived
//                       activations that kernels read many times), hence off.
//   learn_step          0|1 (default 0): the allocator learns the step
//                       (allocator/learned_schedule.h): between two
//                       MarkIteration calls it records the allocations,
//                       frees and the uses the framework reports
//                       (NoteUses), plans (policy/replay_schedule.h) which
//                       live allocations go away to the host and when they
//                       come back, and replays that plan in the next steps
//                       while they repeat the recorded one, learning again
//                       when the step changes. Nothing is discarded in
//                       this mode but what empty_cache, a Sleep or a
//                       smaller budget give back (DeviceAllocator::
//                       DiscardDead). Needs segments:arena.
//   learn_transfer_thread  0|1 (default 0): the learned step's bring-backs
//                       are issued by a thread of their own, not by the
//                       thread reporting the step (whose launches the
//                       driver's prefetch to a full device held up).
//                       Needs learn_step:1.
//   device_headroom     size (default 1G): with oversubscribe:1, device
//                       memory left to what is not this allocator's (the
//                       CUDA context, kernels loaded later, libraries).
// Sizes take an optional K, M or G suffix (powers of 1024).
//
// Errors: an unknown key or bad value returns kInvalidArgument naming the key
// and the accepted values; nothing is partially applied.
// Thread safety: pure functions and a value type.
#ifndef CMA_POLICY_CONFIG_H_
#define CMA_POLICY_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/roundup_divisions.h"
#include "absl/strings/string_view.h"

namespace cma {

enum class PrefetchPolicy { kNone, kOnAlloc, kOnMove };
enum class PreferredLocationPolicy { kNone, kDevice, kHost };
enum class SegmentMode { kArena, kClassic };

struct AllocatorConfig {
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  RoundupDivisions roundup_power2_divisions;  // every count 0: plain 512-byte rounding
  double garbage_collection_threshold = 0.0;  // 0: off
  PrefetchPolicy prefetch = PrefetchPolicy::kOnAlloc;
  PreferredLocationPolicy preferred_location = PreferredLocationPolicy::kNone;
  bool accessed_by_all = false;
  std::vector<int> accessed_by;
  bool discard_on_free = false;
  double managed_budget_fraction = 1.0;  // used when managed_budget_bytes == 0
  std::size_t managed_budget_bytes = 0;
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  bool release_before_peak = false;
  bool multicast = false;
  SegmentMode segments = SegmentMode::kArena;
  std::size_t arena_size = 0;  // 0: the managed budget
  double idle_page_slack = -1;  // < 0: off
  std::size_t sleep_staging_max = std::numeric_limits<std::size_t>::max();  // max: none
  int sleep_pin_threads = 8;
  bool wake_fence = true;
  bool oversubscribe = false;
  bool host_plan = false;
  bool learn_step = false;
  bool learn_transfer_thread = false;
  std::size_t device_headroom = std::size_t{1} << 30;

  // The config back in `key:value` form (only keys that differ from defaults).
  std::string ToString() const;
};

absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(absl::string_view text);

// The keys this library shares with PyTorch, as a PyTorch allocator settings
// string sets them (PYTORCH_CUDA_ALLOC_CONF, torch.cuda.memory.
// _set_allocator_settings). PyTorch resets each of them that its string does
// not name; here an unnamed one takes `base`'s value (CMA_ALLOC_CONF's).
struct SharedSettings {
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  RoundupDivisions roundup_power2_divisions;
  double garbage_collection_threshold = 0.0;
};
// Reads the shared keys of `pytorch_settings` with this library's parser (so
// its errors name the key and the accepted values) and ignores every other
// key: those are PyTorch's own (expandable_segments, pinned_*, ...), which
// PyTorch has validated.
absl::StatusOr<SharedSettings> ParsePyTorchSharedSettings(absl::string_view pytorch_settings,
                                                          const AllocatorConfig& base);
// Parses the CMA_ALLOC_CONF environment variable (defaults when unset).
absl::StatusOr<AllocatorConfig> AllocatorConfigFromEnv();
// "512", "64K", "20M", "8G" -> bytes.
absl::StatusOr<std::size_t> ParseSize(absl::string_view text);

}  // namespace cma

#endif  // CMA_POLICY_CONFIG_H_
