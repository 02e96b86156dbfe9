// The link's speed, as measured by bench/cuda/link_duplex_bench.cu, and the
// time a step's transfers need at it (bench/link_limit.cc). Rates are in
// GB/s (1e9 bytes per second), bytes per step in, seconds out.
//
// Thread-compatible; pure functions.
#ifndef CMA_BENCH_LINK_MODEL_H_
#define CMA_BENCH_LINK_MODEL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cma {

struct LinkRates {
  std::string method;  // how the bytes move (copy engines, SM copies, prefetch) or "flags"
  // Each direction's rate while both directions run at once (required).
  double h2d = 0;
  double d2h = 0;
  // Their total while both run at once: a cap on h2d + d2h (0: none).
  double duplex_total = 0;
  // Each direction's rate alone (0: unknown).
  double h2d_alone = 0;
  double d2h_alone = 0;
};

// max(h2d_bytes / h2d, d2h_bytes / d2h, (h2d_bytes + d2h_bytes) /
// duplex_total): the link-bound time with both directions busy at once.
double LinkBoundSeconds(const LinkRates& rates, double h2d_bytes, double d2h_bytes);

// The least time when the link may also carry one direction alone, at its
// alone rate, for part of the time (traffic mostly one way runs faster than
// at the simultaneous rates): at most LinkBoundSeconds, equal to it when an
// alone rate is unknown.
double MixedLinkBoundSeconds(const LinkRates& rates, double h2d_bytes, double d2h_bytes);

// Every method of link_duplex_bench's JSON ("summary": {method: {
// "h2d_alone_gbps", "d2h_alone_gbps", "duplex_h2d_gbps", "duplex_d2h_gbps"}}).
// kInvalidArgument naming the file and the method for bad JSON, a missing
// key or a rate that is not positive.
absl::StatusOr<std::vector<LinkRates>> ParseLinkJson(absl::string_view text,
                                                     absl::string_view name = "link");

}  // namespace cma

#endif  // CMA_BENCH_LINK_MODEL_H_
