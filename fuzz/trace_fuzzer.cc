// libFuzzer: the trace parser never crashes and accepts only well-formed
// lines (every accepted op is an alloc or a free).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "bench/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<cma::TraceOp>> ops = cma::ParseTrace(text, "fuzz");
  if (!ops.ok() && ops.status().message().empty()) std::abort();
  return 0;
}
