// Reader for recorded steps (bench/torch_record_step.py writes them;
// bench/link_limit.cc reads them): plain or gzip'ed text, one event a line.
//
//   cma_step v1                 the header, before any event
//   live,<id>,<bytes>           an allocation that exists when the step begins
//   alloc,<id>,<bytes>          an allocation made during the step
//   use,<id>[:<mode>][,<id>[:<mode>]]...
//                               one kernel: every named allocation resident at
//                               once; mode r, w or rw (default rw)
//   free,<id>
//   # key=value                 metadata (e.g. in_memory_s=0.263); any other
//                               line starting with '#' and blank lines are skipped
//
// ids and bytes are unsigned decimal integers; the events obey
// policy/offline_schedule.h's rules (an id declared once, before its uses and
// free). Any other line, a missing header or a broken rule returns
// kInvalidArgument naming the file, the line number and the line.
// Thread-compatible.
#ifndef CMA_BENCH_STEP_FILE_H_
#define CMA_BENCH_STEP_FILE_H_

#include <cstdint>
#include <string>

#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "policy/offline_schedule.h"

namespace cma {

struct StepFile {
  Step step;
  absl::btree_map<std::string, std::string> meta;  // from '# key=value' lines
  std::int64_t lines = 0;
};

absl::StatusOr<StepFile> ParseStepFile(absl::string_view text, absl::string_view name = "step");
absl::StatusOr<StepFile> ReadStepFile(const std::string& path);

}  // namespace cma

#endif  // CMA_BENCH_STEP_FILE_H_
