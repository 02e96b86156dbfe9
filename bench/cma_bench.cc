// cma_bench: the allocator against what users would otherwise call, side by
// side in one run, written as JSON.
//
//   cma_bench --backend=host|cuda|hip|best --suite=latency|replay|migration|all
//             [--trace=a.csv.gz,b.csv] [--json=out.json]
//
// Latency: median alloc+free pair per size, cached allocator (steady state)
// against the backend's raw managed allocation, plus vendor baselines where
// the backend has them. Replay: real PyTorch traces, peak reserved against
// peak requested.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <set>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "backends/registry.h"
#include "bench/baselines.h"
#include "nlohmann/json.hpp"
#include "bench/replay.h"
#include "bench/trace.h"

ABSL_FLAG(std::string, backend, "best", "host, cuda, hip or best");
ABSL_FLAG(std::string, suite, "all",
          "comma-separated: latency, replay, migration, symmetric, or all");
ABSL_FLAG(std::string, trace, "",
          "comma-separated traces (CSV or .csv.gz); default: bench/traces/*.csv.gz");
ABSL_FLAG(std::string, json, "", "write results here as JSON");
ABSL_FLAG(std::string, config, "",
          "CMA_ALLOC_CONF text for the allocator under test (default: the CMA_ALLOC_CONF "
          "environment variable)");
ABSL_FLAG(bool, replay_in_pool, true,
          "replay each trace a second time inside a private pool (PyTorch's use_mem_pool)");
ABSL_FLAG(int, device, 0, "device to measure");
ABSL_FLAG(int, host_memory_gib, 16,
          "memory of each emulated device of the host backend, in GiB (replays of traces "
          "whose peak exceeds it run out of memory)");
ABSL_FLAG(int, host_busy_queries, 0,
          "host backend: the percent of queries of an idle stream answered busy, as a GPU's "
          "streams are often mid-kernel when asked (HostBackendOptions::busy_query_percent)");
ABSL_FLAG(int, reps, 15, "repetitions per latency point (the median is reported)");

namespace cma {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median over `reps` batches of the mean time of one call of `pair`.
template <typename F>
double MedianPairNs(int reps, int per_rep, F&& pair) {
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < per_rep; ++i) {
      if (!pair()) return -1;
    }
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                      per_rep);
  }
  return Median(samples);
}

absl::Status LatencySuite(Backend& backend, int device, const std::string& config, Json& out) {
  auto alloc = CachingManagedAllocator::Create(backend, config);
  if (!alloc.ok()) return alloc.status();
  // The same allocator with classic segments, side by side: what the arena's
  // page bookkeeping costs on the fast path.
  auto classic = CachingManagedAllocator::Create(
      backend, config.empty() ? "segments:classic" : config + ",segments:classic");
  if (!classic.ok()) return classic.status();
  const int reps = absl::GetFlag(FLAGS_reps);
  Json rows = Json::array();
  std::cout << absl::StrFormat("%12s %16s %16s %14s", "bytes", "cached_pair_ns", "classic_pair_ns",
                               "raw_pair_ns");
  std::vector<std::string> extra_names = BaselineNames(backend);
  for (const std::string& n : extra_names) std::cout << absl::StrFormat(" %24s", n);
  std::cout << "\n";
  for (std::size_t bytes : {std::size_t{512}, std::size_t{4} << 10, std::size_t{64} << 10,
                            std::size_t{256} << 10, std::size_t{1} << 20, std::size_t{4} << 20,
                            std::size_t{16} << 20, std::size_t{64} << 20,
                            std::size_t{256} << 20}) {
    // Steady state: the block is cached after the first pair.
    absl::Status failure;
    auto pair_of = [&](CachingManagedAllocator& a) {
      return [&a, &failure, bytes, device]() {
        absl::StatusOr<void*> p = a.Allocate(bytes, device);
        if (!p.ok()) {
          failure = p.status();
          return false;
        }
        failure = a.Free(*p);
        return failure.ok();
      };
    };
    auto cached_pair = pair_of(**alloc);
    cached_pair();
    const double cached = MedianPairNs(reps, 2000, cached_pair);
    if (!failure.ok()) return failure;
    auto classic_pair = pair_of(**classic);
    classic_pair();
    const double classic_ns = MedianPairNs(reps, 2000, classic_pair);
    if (!failure.ok()) return failure;
    auto raw_pair = [&]() {
      absl::StatusOr<void*> p = backend.AllocateManaged(device, bytes);
      if (!p.ok()) {
        failure = p.status();
        return false;
      }
      failure = backend.FreeManaged(*p);
      return failure.ok();
    };
    raw_pair();
    const double raw = MedianPairNs(reps, bytes >= (std::size_t{64} << 20) ? 5 : 50, raw_pair);
    if (!failure.ok()) return failure;
    Json row = Json::object();
    row["bytes"] = static_cast<std::int64_t>(bytes);
    row["cached_pair_ns"] = cached;
    row["classic_pair_ns"] = classic_ns;
    row["raw_pair_ns"] = raw;
    row["raw_over_cached"] = raw / cached;
    std::cout << absl::StrFormat("%12d %16.1f %16.1f %14.1f", bytes, cached, classic_ns, raw);
    for (const std::string& n : extra_names) {
      absl::StatusOr<double> ns = MeasureBaseline(backend, n, device, bytes, reps);
      if (!ns.ok()) return ns.status();
      row[n] = *ns;
      std::cout << absl::StrFormat(" %24.1f", *ns);
    }
    std::cout << "\n";
    rows.push_back(std::move(row));
  }
  out["latency"] = std::move(rows);
  return absl::OkStatus();
}

std::vector<std::string> DefaultTraces() {
  std::string root;
  if (const char* w = std::getenv("BUILD_WORKSPACE_DIRECTORY")) root = absl::StrCat(w, "/");
  return {root + "bench/traces/resnet50_train.csv.gz",
          root + "bench/traces/kvcache_two_streams.csv.gz",
          root + "bench/traces/bert_train.csv.gz"};
}

absl::Status ReplaySuite(Backend& backend, int device, const std::string& config, Json& out) {
  std::vector<std::string> traces = absl::StrSplit(absl::GetFlag(FLAGS_trace), ',',
                                                   absl::SkipEmpty());
  if (traces.empty()) traces = DefaultTraces();
  // The allocator runs on a wrapper that injects nothing and counts every
  // backend call, so the steady state's calls per operation are measured.
  FaultInjectingBackend counting(backend);
  Json rows = Json::array();
  std::cout << absl::StrFormat("%-38s %14s %14s %7s %7s %8s %10s %10s %11s\n", "trace",
                               "peak_requested", "peak_reserved", "ratio", "device", "arenas",
                               "ns_per_op", "steady_ns", "steady_calls");
  std::vector<std::pair<std::string, bool>> runs;  // (trace, in a pool)
  for (const std::string& path : traces) {
    runs.push_back({path, false});
    if (absl::GetFlag(FLAGS_replay_in_pool)) runs.push_back({path, true});
  }
  for (const auto& [path, in_pool] : runs) {
    absl::StatusOr<std::vector<TraceOp>> ops = ReadTrace(path);
    if (!ops.ok()) return ops.status();
    auto alloc = CachingManagedAllocator::Create(counting, config);
    if (!alloc.ok()) return alloc.status();
    const std::string name = path.substr(path.find_last_of('/') + 1);
    ReplayOptions options;
    options.in_pool = in_pool;
    // On the host backend the same instrument reads its emulated population.
    options.sample_device_memory = true;
    options.calls = [&counting]() { return counting.Calls(FaultKind::kAny); };
    absl::StatusOr<ReplayResult> r = Replay(**alloc, device, *ops, name, options);
    if (!r.ok()) return r.status();
    Json row = Json::object();
    row["trace"] = r->trace;
    row["ops"] = static_cast<std::int64_t>(r->ops);
    row["peak_requested"] = static_cast<std::int64_t>(r->peak_requested);
    row["peak_reserved"] = static_cast<std::int64_t>(r->peak_reserved);
    row["ratio"] = r->ratio;
    row["peak_device_used"] = static_cast<std::int64_t>(r->peak_device_used);
    row["device_ratio"] = r->device_ratio;
    row["backend_allocs"] = static_cast<std::int64_t>(r->backend_allocs);
    row["ns_per_op"] = r->ns_per_op;
    row["steady_ns_per_op"] = r->steady_ns_per_op;
    row["steady_backend_calls_per_op"] = r->steady_backend_calls_per_op;
    row["steady_pages_populated"] = r->steady_pages_populated;
    row["steady_pages_discarded"] = r->steady_pages_discarded;
    row["skipped_frees"] = static_cast<std::int64_t>(r->skipped_frees);
    row["ooms"] = static_cast<std::int64_t>(r->ooms);
    std::cout << absl::StrFormat("%-38s %14d %14d %7.3f %7.3f %8d %10.1f %10.1f %11.4f\n",
                                 r->trace, r->peak_requested, r->peak_reserved, r->ratio,
                                 r->device_ratio, r->backend_allocs, r->ns_per_op,
                                 r->steady_ns_per_op, r->steady_backend_calls_per_op);
    rows.push_back(std::move(row));
  }
  out["replay"] = std::move(rows);
  return absl::OkStatus();
}

int Main() {
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  const int host_gib = absl::GetFlag(FLAGS_host_memory_gib);
  if (host_gib <= 0) {
    std::cerr << "cma_bench: --host_memory_gib must be positive, not " << host_gib << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(backend_name);
  // The host backend (asked for, or what "best" fell back to) with the
  // emulated memory asked for.
  if (backend.ok() && std::string((*backend)->name()) == "host") {
    HostBackendOptions options;
    options.device_capacity = static_cast<std::size_t>(host_gib) << 30;
    options.busy_query_percent = absl::GetFlag(FLAGS_host_busy_queries);
    if (options.busy_query_percent < 0 || options.busy_query_percent > 100) {
      std::cerr << "cma_bench: --host_busy_queries must be 0-100, not "
                << options.busy_query_percent << "\n";
      return 2;
    }
    backend = std::unique_ptr<Backend>(new HostBackend(options));
  }
  if (!backend.ok()) {
    std::cerr << "cma_bench: " << backend.status() << "\n";
    return 2;
  }
  const int device = absl::GetFlag(FLAGS_device);
  const std::string suite = absl::GetFlag(FLAGS_suite);
  // --config wins; otherwise the environment, as the library itself reads it.
  std::string config = absl::GetFlag(FLAGS_config);
  std::string config_source = "--config";
  if (config.empty()) {
    const char* env = std::getenv("CMA_ALLOC_CONF");
    config = env != nullptr ? env : "";
    config_source = env != nullptr ? "CMA_ALLOC_CONF" : "defaults";
  }
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
  if (!parsed.ok()) {
    std::cerr << "cma_bench: bad configuration from " << config_source << ": "
              << parsed.status().message() << "\n";
    return 2;
  }
  std::set<std::string> suites;
  for (absl::string_view s : absl::StrSplit(suite, ',', absl::SkipEmpty())) {
    if (s == "all") {
      suites.insert({"latency", "replay", "migration", "symmetric"});
    } else if (s == "latency" || s == "replay" || s == "migration" || s == "symmetric") {
      suites.insert(std::string(s));
    } else {
      std::cerr << "cma_bench: --suite takes latency, replay, migration, symmetric or all "
                   "(comma-separated)\n";
      return 2;
    }
  }
  Json out = Json::object();
  out["backend"] = (*backend)->name();
  absl::StatusOr<DeviceFacts> facts = (*backend)->GetDeviceFacts(device);
  if (!facts.ok()) {
    std::cerr << "cma_bench: " << facts.status() << "\n";
    return 2;
  }
  out["device"] = facts->name;
  out["page_fault_migration"] = facts->page_fault_migration;
  out["concurrent_managed_access"] = facts->concurrent_managed_access;
  out["pageable_memory_access"] = facts->pageable_memory_access;
  out["runtime"] = facts->runtime;
  if (!facts->xnack.empty()) out["xnack"] = facts->xnack;
  if (!facts->managed_memory_note.empty()) out["managed_memory"] = facts->managed_memory_note;
  out["config"] = config;
  out["config_source"] = config_source;
  out["config_in_effect"] = parsed->ToString();
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  out["date"] = date;
  std::cout << "backend " << (*backend)->name() << ", device " << device << ": " << facts->name
            << "\n";
  std::cout << "runtime: " << facts->runtime << "\n";
  if (!facts->managed_memory_note.empty()) {
    std::cout << "managed memory: " << facts->managed_memory_note << "\n";
  }
  std::cout << "config (" << config_source << "): "
            << (parsed->ToString().empty() ? "defaults" : parsed->ToString()) << "\n";
  absl::Status s;
  if (suites.count("latency")) s.Update(LatencySuite(**backend, device, config, out));
  if (s.ok() && suites.count("replay")) s.Update(ReplaySuite(**backend, device, config, out));
  if (s.ok() && suites.count("migration")) s.Update(MigrationSuite(**backend, device, out));
  if (s.ok() && suites.count("symmetric")) {
    s.Update(SymmetricSuite(**backend, out));
    if (out.contains("symmetric")) std::cout << "symmetric: " << out["symmetric"].dump() << "\n";
  }
  if (!s.ok()) {
    std::cerr << "cma_bench: " << s << "\n";
    return 1;
  }
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::cerr << "cma_bench: cannot write " << json_path << "\n";
      return 1;
    }
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace cma

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cma::Main();
}
