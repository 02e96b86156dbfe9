// Reader for allocation traces: CSV or gzip'ed CSV with the header
// `seq,action,addr,size,stream`, action `alloc` or `free`.
//
// Errors: a missing file, a wrong header or a malformed line returns
// kInvalidArgument naming the file and line. Thread-compatible.
#ifndef CMA_BENCH_TRACE_H_
#define CMA_BENCH_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cma {

struct TraceOp {
  bool alloc = true;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
};

absl::StatusOr<std::vector<TraceOp>> ReadTrace(const std::string& path);
// The whole text of a file, gzip'ed or plain; errors name `what` and the path.
absl::StatusOr<std::string> ReadMaybeGzipped(const std::string& path, absl::string_view what);
// Parses trace text already in memory (used by ReadTrace and the fuzzer).
absl::StatusOr<std::vector<TraceOp>> ParseTrace(absl::string_view text,
                                                absl::string_view name = "trace");

}  // namespace cma

#endif  // CMA_BENCH_TRACE_H_
