// libFuzzer: the arena checker's step language with away steps
// (tests/arena_checker.h, SendAway and BringBack) driven by the fuzzer's
// bytes: the first byte picks a configuration, the rest the steps. Its own
// target and corpus, so that arena_checker_fuzzer's corpus keeps meaning
// the language it was recorded in.
#include <cstdint>

#include "fuzz/checker_fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const char* const kConfigs[] = {
      "",
      "idle_page_slack:0",
      "discard_on_free:1",
      "release_threshold:8M,sleep_staging_max:6M",
      "arena_size:32M",
      "garbage_collection_threshold:0.5",
      "managed_budget:32M",
      "segments:classic",
  };
  return cma::RunCheckerInput(data, size, kConfigs, /*away_steps=*/true);
}
