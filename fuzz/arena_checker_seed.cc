// The arena checker (tests/arena_checker.h) on one fresh seed, for
// fuzz/long_fuzz.sh: //tests:arena_checker_test runs fixed seeds only.
//   arena_checker_seed SEED [STEPS]
// The seed alone picks the configuration (those of arena_checker_test), the
// pool-checkpoint steps (on for odd seed / 13) and every step, so the line
// that names it reproduces a failure. STEPS defaults to 2500, as the test's.
// Prints one line naming the run; exits 1 with the violated rule and the
// recent steps on a failure (a crash or sanitizer report ends it otherwise).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/arena_checker.h"

namespace {

struct Case {
  const char* name;
  const char* config;
};

// tests/arena_checker_test.cc's configurations.
constexpr Case kCases[] = {
    {"default", ""},
    {"slack", "idle_page_slack:0.1"},
    {"strict", "idle_page_slack:0"},
    {"discard_on_free", "discard_on_free:1"},
    {"release_threshold", "release_threshold:16M"},
    {"staging_bound", "sleep_staging_max:24M"},
    {"migrate_only", "sleep_staging_max:0"},
    {"small_arenas", "arena_size:16M"},
    {"gc", "garbage_collection_threshold:0.5,arena_size:32M"},
    {"power2", "roundup_power2_divisions:4"},
    {"no_prefetch", "prefetch:none"},
    {"classic", "segments:classic"},
    {"classic_discard", "segments:classic,discard_on_free:1"},
};
constexpr std::uint64_t kCaseCount = sizeof(kCases) / sizeof(kCases[0]);

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s SEED [STEPS]\n", argv[0]);
    return 2;
  }
  char* end = nullptr;
  const std::uint64_t seed = std::strtoull(argv[1], &end, 10);
  const long steps = argc == 3 ? std::strtol(argv[2], nullptr, 10) : 2500;
  if (*end != '\0' || steps <= 0) {
    std::fprintf(stderr, "arena_checker_seed: bad SEED or STEPS\n");
    return 2;
  }
  const Case& c = kCases[seed % kCaseCount];
  const bool checkpoints = (seed / kCaseCount) % 2 == 1;
  const bool away = (seed / kCaseCount / 2) % 2 == 1;
  std::printf("seed %llu: config '%s' (%s), pool checkpoints %s, away steps %s, %ld steps\n",
              static_cast<unsigned long long>(seed), c.config, c.name, checkpoints ? "on" : "off",
              away ? "on" : "off", steps);
  std::fflush(stdout);
  auto checker = cma::ArenaChecker::Create(c.config, std::size_t{256} << 20, checkpoints, away);
  if (!checker.ok()) {
    std::printf("FAILED: %s\n", std::string(checker.status().message()).c_str());
    return 1;
  }
  cma::SeededSource in(seed);
  absl::Status s;
  for (long i = 0; i < steps && s.ok(); ++i) s = (*checker)->Step(in);
  if (s.ok()) s = (*checker)->Finish();
  if (!s.ok()) {
    std::printf("FAILED: %s\n", std::string(s.message()).c_str());  // with the recent steps
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
