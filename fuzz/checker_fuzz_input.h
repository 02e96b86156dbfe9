// One libFuzzer input for the arena checker (tests/arena_checker.h): the
// first byte picks one of `configs`, the rest the steps; any violated rule,
// crash or leak aborts with the recent steps. Shared by the checker's
// fuzzers, which differ in their step language and configurations.
#ifndef CMA_FUZZ_CHECKER_FUZZ_INPUT_H_
#define CMA_FUZZ_CHECKER_FUZZ_INPUT_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/arena_checker.h"

namespace cma {

template <std::size_t N>
int RunCheckerInput(const std::uint8_t* data, std::size_t size, const char* const (&configs)[N],
                    bool away_steps) {
  ByteSource in(data, size);
  const char* config = configs[in.Next(N)];
  auto checker = ArenaChecker::Create(config, std::size_t{64} << 20,
                                      /*pool_checkpoints=*/false, away_steps);
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

}  // namespace cma

#endif  // CMA_FUZZ_CHECKER_FUZZ_INPUT_H_
