#include "policy/config.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace cma {
namespace {

constexpr absl::string_view kKeys =
    "max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, prefetch, "
    "preferred_location, accessed_by, discard_on_free, managed_budget, release_threshold, "
    "release_before_peak, multicast, segments, arena_size, idle_page_slack, sleep_staging_max, "
    "sleep_pin_threads, wake_fence, oversubscribe, device_headroom, host_plan, learn_step, "
    "learn_transfer_thread";

absl::Status Bad(absl::string_view key, absl::string_view value, absl::string_view accepted) {
  return absl::InvalidArgumentError(absl::StrCat("CMA_ALLOC_CONF: bad value '", value,
                                                 "' for key '", key, "'; accepted: ", accepted));
}

// Enough digits that the text parses back to the same double (StrCat's six
// would turn 0.9999999999 into 1, which the parser then rejects).
std::string Exact(double v) { return absl::StrFormat("%.17g", v); }

absl::StatusOr<bool> ParseFlag(absl::string_view key, absl::string_view v) {
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  return Bad(key, v, "0 or 1");
}

absl::Status ApplyKey(absl::string_view key, absl::string_view v, AllocatorConfig& c) {
  if (key == "max_split_size_mb") {
    std::size_t mb;
    if (!absl::SimpleAtoi(v, &mb) || mb == 0 || mb > (std::size_t{1} << 40)) {
      return Bad(key, v, "a positive number of MiB");
    }
    c.max_split_size = mb << 20;
  } else if (key == "roundup_power2_divisions") {
    absl::StatusOr<RoundupDivisions> d = RoundupDivisions::Parse(v);
    if (!d.ok()) {
      return Bad(key, v, absl::StrCat("0 or a power of two up to 32768, or [MiB:count,...,>:count] "
                                      "as PyTorch's (", d.status().message(), ")"));
    }
    c.roundup_power2_divisions = *d;
  } else if (key == "garbage_collection_threshold") {
    double t;
    if (!absl::SimpleAtod(v, &t) || !(t > 0.0 && t < 1.0)) {
      return Bad(key, v, "a fraction strictly between 0 and 1");
    }
    c.garbage_collection_threshold = t;
  } else if (key == "prefetch") {
    if (v == "none") c.prefetch = PrefetchPolicy::kNone;
    else if (v == "on_alloc") c.prefetch = PrefetchPolicy::kOnAlloc;
    else if (v == "on_move") c.prefetch = PrefetchPolicy::kOnMove;
    else return Bad(key, v, "none, on_alloc, on_move");
  } else if (key == "preferred_location") {
    if (v == "none") c.preferred_location = PreferredLocationPolicy::kNone;
    else if (v == "device") c.preferred_location = PreferredLocationPolicy::kDevice;
    else if (v == "host") c.preferred_location = PreferredLocationPolicy::kHost;
    else return Bad(key, v, "none, device, host");
  } else if (key == "accessed_by") {
    c.accessed_by.clear();
    c.accessed_by_all = false;
    if (v == "all") {
      c.accessed_by_all = true;
    } else if (v != "none") {
      for (absl::string_view d : absl::StrSplit(v, '+')) {
        int dev;
        if (!absl::SimpleAtoi(d, &dev) || dev < 0) {
          return Bad(key, v, "none, all, or device ids joined by '+' (e.g. 0+1)");
        }
        c.accessed_by.push_back(dev);
      }
    }
  } else if (key == "discard_on_free") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.discard_on_free = *f;
  } else if (key == "managed_budget") {
    double frac;
    // A number up to 1 is a fraction; a whole number above it, or one with a
    // K/M/G suffix, is a size in bytes.
    const bool is_number = absl::SimpleAtod(v, &frac);
    if (is_number && (frac <= 1.0 || v.find('.') != absl::string_view::npos)) {
      if (!(frac > 0.0 && frac <= 1.0)) {
        return Bad(key, v, "a fraction in (0, 1] or a size such as 8G");
      }
      c.managed_budget_fraction = frac;
      c.managed_budget_bytes = 0;
    } else {
      auto s = ParseSize(v);
      if (!s.ok() || *s == 0) return Bad(key, v, "a fraction in (0, 1] or a size such as 8G");
      c.managed_budget_bytes = *s;
    }
  } else if (key == "release_threshold") {
    auto s = ParseSize(v);
    if (!s.ok()) return Bad(key, v, "a size such as 0, 512M or 2G");
    c.release_threshold = *s;
  } else if (key == "release_before_peak") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.release_before_peak = *f;
  } else if (key == "multicast") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.multicast = *f;
  } else if (key == "segments") {
    if (v == "arena") c.segments = SegmentMode::kArena;
    else if (v == "classic") c.segments = SegmentMode::kClassic;
    else return Bad(key, v, "arena, classic");
  } else if (key == "idle_page_slack") {
    double f;
    if (v == "off") {
      c.idle_page_slack = -1;
    } else if (absl::SimpleAtod(v, &f) && f >= 0.0 && f <= 1.0) {
      c.idle_page_slack = f;
    } else {
      return Bad(key, v, "off, or a fraction from 0 to 1");
    }
  } else if (key == "arena_size") {
    auto s = ParseSize(v);
    // At least one 2 MiB page; at most 1 TiB of address space per arena.
    if (!s.ok() || (*s != 0 && (*s < (std::size_t{2} << 20) || *s > (std::size_t{1} << 40)))) {
      return Bad(key, v, "0 (the managed budget) or a size from 2M to 1024G");
    }
    c.arena_size = *s;
  } else if (key == "sleep_staging_max") {
    if (v == "none") {
      c.sleep_staging_max = std::numeric_limits<std::size_t>::max();
    } else {
      auto s = ParseSize(v);
      if (!s.ok() || *s == std::numeric_limits<std::size_t>::max()) {
        return Bad(key, v, "none, or a size such as 0, 512M or 16G");
      }
      c.sleep_staging_max = *s;
    }
  } else if (key == "sleep_pin_threads") {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 1 || n > 64) return Bad(key, v, "a count from 1 to 64");
    c.sleep_pin_threads = n;
  } else if (key == "wake_fence") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.wake_fence = *f;
  } else if (key == "oversubscribe") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.oversubscribe = *f;
  } else if (key == "host_plan") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.host_plan = *f;
  } else if (key == "learn_step") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.learn_step = *f;
  } else if (key == "learn_transfer_thread") {
    auto f = ParseFlag(key, v);
    if (!f.ok()) return f.status();
    c.learn_transfer_thread = *f;
  } else if (key == "device_headroom") {
    auto n = ParseSize(v);
    if (!n.ok()) return Bad(key, v, "a size such as 512M or 1G");
    c.device_headroom = *n;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("CMA_ALLOC_CONF: unknown key '", key, "'; accepted keys: ", kKeys));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::size_t> ParseSize(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  std::size_t shift = 0;
  if (!t.empty()) {
    switch (absl::ascii_toupper(t.back())) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: break;
    }
    if (shift) t.remove_suffix(1);
  }
  std::size_t n;
  if (!absl::SimpleAtoi(t, &n) || (shift && n > (std::numeric_limits<std::size_t>::max() >> shift))) {
    return absl::InvalidArgumentError(absl::StrCat("not a size: '", text, "'"));
  }
  return n << shift;
}

namespace {

// The key:value items of `text`: split at commas outside brackets (PyTorch's
// per-interval roundup_power2_divisions has commas inside its brackets).
std::vector<absl::string_view> Items(absl::string_view text) {
  std::vector<absl::string_view> items;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] == '[') ++depth;
    if (i < text.size() && text[i] == ']' && depth > 0) --depth;
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      const absl::string_view item = absl::StripAsciiWhitespace(text.substr(start, i - start));
      if (!item.empty()) items.push_back(item);
      start = i + 1;
    }
  }
  return items;
}

}  // namespace

absl::StatusOr<AllocatorConfig> ParseAllocatorConfig(absl::string_view text) {
  AllocatorConfig c;
  for (absl::string_view item : Items(text)) {
    item = absl::StripAsciiWhitespace(item);
    const auto colon = item.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CMA_ALLOC_CONF: '", item, "' is not key:value; accepted keys: ", kKeys));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(item.substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(item.substr(colon + 1));
    if (auto s = ApplyKey(key, value, c); !s.ok()) return s;
  }
  if (c.learn_step && c.segments != SegmentMode::kArena) {
    return absl::InvalidArgumentError(
        "CMA_ALLOC_CONF: learn_step:1 needs segments:arena (live allocations are sent away by "
        "their 2 MiB pages)");
  }
  if (c.learn_transfer_thread && !c.learn_step) {
    return absl::InvalidArgumentError(
        "CMA_ALLOC_CONF: learn_transfer_thread:1 needs learn_step:1 (it makes the learned "
        "step's transfer calls)");
  }
  if (c.oversubscribe && c.segments != SegmentMode::kArena) {
    return absl::InvalidArgumentError(
        "CMA_ALLOC_CONF: oversubscribe:1 needs segments:arena (the device part of the budget "
        "is counted in populated arena pages)");
  }
  return c;
}

absl::StatusOr<SharedSettings> ParsePyTorchSharedSettings(absl::string_view pytorch_settings,
                                                          const AllocatorConfig& base) {
  AllocatorConfig c = base;
  for (absl::string_view item : Items(pytorch_settings)) {
    const auto colon = item.find(':');
    const absl::string_view key = absl::StripAsciiWhitespace(item.substr(0, colon));
    if (key != "max_split_size_mb" && key != "roundup_power2_divisions" &&
        key != "garbage_collection_threshold") {
      continue;
    }
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("PyTorch allocator settings: '", item,
                                                     "' is not key:value"));
    }
    if (auto s = ApplyKey(key, absl::StripAsciiWhitespace(item.substr(colon + 1)), c); !s.ok()) {
      return s;
    }
  }
  return SharedSettings{c.max_split_size, c.roundup_power2_divisions,
                        c.garbage_collection_threshold};
}

absl::StatusOr<AllocatorConfig> AllocatorConfigFromEnv() {
  const char* env = std::getenv("CMA_ALLOC_CONF");
  return ParseAllocatorConfig(env ? env : "");
}

std::string AllocatorConfig::ToString() const {
  const AllocatorConfig d;
  std::vector<std::string> parts;
  if (max_split_size != d.max_split_size) {
    parts.push_back(absl::StrCat("max_split_size_mb:", max_split_size >> 20));
  }
  if (roundup_power2_divisions != d.roundup_power2_divisions) {
    parts.push_back(absl::StrCat("roundup_power2_divisions:", roundup_power2_divisions.ToString()));
  }
  if (garbage_collection_threshold > 0) {
    parts.push_back(
        absl::StrCat("garbage_collection_threshold:", Exact(garbage_collection_threshold)));
  }
  if (prefetch != d.prefetch) {
    parts.push_back(absl::StrCat("prefetch:", prefetch == PrefetchPolicy::kNone ? "none" : "on_move"));
  }
  if (preferred_location != d.preferred_location) {
    parts.push_back(absl::StrCat("preferred_location:",
                                 preferred_location == PreferredLocationPolicy::kHost ? "host"
                                                                                      : "device"));
  }
  if (accessed_by_all) parts.push_back("accessed_by:all");
  else if (!accessed_by.empty()) parts.push_back(absl::StrCat("accessed_by:", absl::StrJoin(accessed_by, "+")));
  if (discard_on_free) parts.push_back("discard_on_free:1");
  if (managed_budget_bytes) parts.push_back(absl::StrCat("managed_budget:", managed_budget_bytes));
  else if (managed_budget_fraction != 1.0) {
    parts.push_back(absl::StrCat("managed_budget:", Exact(managed_budget_fraction)));
  }
  if (release_threshold != d.release_threshold) {
    parts.push_back(absl::StrCat("release_threshold:", release_threshold));
  }
  if (release_before_peak) parts.push_back("release_before_peak:1");
  if (multicast) parts.push_back("multicast:1");
  if (segments != d.segments) parts.push_back("segments:classic");
  if (arena_size) parts.push_back(absl::StrCat("arena_size:", arena_size));
  if (idle_page_slack >= 0) parts.push_back(absl::StrCat("idle_page_slack:", Exact(idle_page_slack)));
  if (sleep_staging_max != d.sleep_staging_max) {
    parts.push_back(absl::StrCat("sleep_staging_max:", sleep_staging_max));
  }
  if (sleep_pin_threads != d.sleep_pin_threads) {
    parts.push_back(absl::StrCat("sleep_pin_threads:", sleep_pin_threads));
  }
  if (!wake_fence) parts.push_back("wake_fence:0");
  if (oversubscribe) parts.push_back("oversubscribe:1");
  if (host_plan) parts.push_back("host_plan:1");
  if (learn_step) parts.push_back("learn_step:1");
  if (learn_transfer_thread) parts.push_back("learn_transfer_thread:1");
  if (device_headroom != d.device_headroom) {
    parts.push_back(absl::StrCat("device_headroom:", device_headroom));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace cma
