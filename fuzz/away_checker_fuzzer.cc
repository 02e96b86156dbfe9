// libFuzzer: the arena checker's step language with away steps
// (tests/arena_checker.h, SendAway and BringBack) driven by the fuzzer's
// bytes: the first byte picks a configuration, the rest the steps. Its own
// target and corpus, so that arena_checker_fuzzer's corpus keeps meaning
// the language it was recorded in.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/arena_checker.h"

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
  cma::ByteSource in(data, size);
  const char* config = kConfigs[in.Next(8)];
  auto checker = cma::ArenaChecker::Create(config, std::size_t{64} << 20,
                                           /*pool_checkpoints=*/false, /*away_steps=*/true);
  if (!checker.ok()) std::abort();
  absl::Status s;
  for (int i = 0; i < 2000 && s.ok() && !in.exhausted(); ++i) s = (*checker)->Step(in);
  if (s.ok()) s = (*checker)->Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "config '%s': %s\n", config, std::string(s.message()).c_str());
    std::abort();
  }
  return 0;
}
