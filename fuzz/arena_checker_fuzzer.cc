// libFuzzer: the arena checker's step language (tests/arena_checker.h) driven
// by the fuzzer's bytes: the first byte picks a configuration, the rest the
// steps. Any violated rule, crash or leak aborts with the recent steps.
#include <cstdint>

#include "fuzz/checker_fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const char* const kConfigs[] = {
      "",
      "idle_page_slack:0",
      "discard_on_free:1",
      "release_threshold:8M,sleep_staging_max:6M",
      "arena_size:8M",
      "garbage_collection_threshold:0.5,arena_size:16M",
      "roundup_power2_divisions:4,prefetch:none",
      "segments:classic,discard_on_free:1",
  };
  return cma::RunCheckerInput(data, size, kConfigs, /*away_steps=*/false);
}
