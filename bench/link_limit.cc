// The link's limit for a recorded step (issue 48): for each device part, the
// bytes that must cross between host and device (an offline schedule, and a
// lower bound no schedule beats; policy/offline_schedule.h), the time they
// take at the link's measured simultaneous rates, and the step's bound
// max(in-memory time, link-bound time). With measured step times, every
// figure three ways: s/step, fraction of in-memory speed, fraction of the
// bound's speed.
//
//   link_limit --step=step.csv.gz [--fractions=1.0,0.67,0.33 | --device_bytes=40GiB,20GiB]
//              [--link_json=link.json [--link_method=best] |
//               --h2d_gbps=X --d2h_gbps=Y [--duplex_gbps=Z]]
//              [--in_memory_s=0.263] [--measured_s=0.31,0.59,1.07] [--repeat=true]
//              [--json=out.json] [--moves]
//
// The step file's format is in bench/step_file.h; torch_record_step.py writes
// it, with in_memory_s as metadata. Fractions are of the step's live peak
// (what torch.cuda.max_memory_allocated counts), so 1/1.5 and 1/3 match
// torch_oversub_bench.py's ratios 1.5 and 3.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/link_model.h"
#include "bench/step_file.h"
#include "nlohmann/json.hpp"
#include "policy/offline_schedule.h"

ABSL_FLAG(std::string, step, "", "the recorded step (bench/step_file.h; .gz read as such)");
ABSL_FLAG(std::string, device_bytes, "",
          "comma-separated device parts: bytes, or with KiB/MiB/GiB (or KB/MB/GB)");
ABSL_FLAG(std::string, fractions, "",
          "comma-separated device parts as fractions of the step's live peak "
          "(default 1.0,0.67,0.33 when --device_bytes is not given either)");
ABSL_FLAG(bool, repeat, true, "the step repeats: steady-state bytes per step");
ABSL_FLAG(double, h2d_gbps, 0, "host-to-device GB/s while both directions run at once");
ABSL_FLAG(double, d2h_gbps, 0, "device-to-host GB/s while both directions run at once");
ABSL_FLAG(double, duplex_gbps, 0,
          "total GB/s with both directions at once (a cap; alone it sets each direction to half)");
ABSL_FLAG(std::string, link_json, "", "link_duplex_bench's JSON instead of the rate flags");
ABSL_FLAG(std::string, link_method, "best",
          "with --link_json: best (the fastest method for each figure) or one method's name");
ABSL_FLAG(double, in_memory_s, 0, "the in-memory step time (default: the step file's in_memory_s)");
ABSL_FLAG(std::string, measured_s, "", "comma-separated measured s/step, one per device part");
ABSL_FLAG(std::string, json, "", "write the results here as JSON");
ABSL_FLAG(bool, moves, false, "include the schedule's moves in the JSON");

namespace cma {
namespace {

using Json = nlohmann::json;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int Fail(const std::string& message) {
  std::fprintf(stderr, "link_limit: %s\n", message.c_str());
  return 2;
}

absl::StatusOr<std::uint64_t> ParseSize(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  struct Suffix {
    const char* name;
    double scale;
  } suffixes[] = {{"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", kGiB},   {"KB", 1e3},
                  {"MB", 1e6},     {"GB", 1e9},          {"B", 1.0}};
  double scale = 1;
  for (const Suffix& s : suffixes) {
    if (absl::ConsumeSuffix(&text, s.name)) {
      scale = s.scale;
      break;
    }
  }
  double number;
  if (!absl::SimpleAtod(text, &number) || !(number > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat("bad size '%s'", text));
  }
  return static_cast<std::uint64_t>(number * scale);
}

absl::StatusOr<std::vector<double>> ParseDoubles(const std::string& list, const char* flag) {
  std::vector<double> out;
  for (absl::string_view f : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    double v;
    if (!absl::SimpleAtod(f, &v) || !(v > 0)) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s: bad number '%s'", flag, f));
    }
    out.push_back(v);
  }
  return out;
}

struct Part {
  std::string label;
  std::uint64_t bytes = 0;
};

// The link's rates: from the flags, or every (or one) method of the JSON.
absl::StatusOr<std::vector<LinkRates>> Rates() {
  LinkRates flags;
  flags.method = "flags";
  flags.h2d = absl::GetFlag(FLAGS_h2d_gbps);
  flags.d2h = absl::GetFlag(FLAGS_d2h_gbps);
  flags.duplex_total = absl::GetFlag(FLAGS_duplex_gbps);
  if (flags.duplex_total > 0 && flags.h2d == 0 && flags.d2h == 0) {
    flags.h2d = flags.d2h = flags.duplex_total / 2;
  }
  if (flags.h2d > 0 || flags.d2h > 0) {
    if (!(flags.h2d > 0 && flags.d2h > 0)) {
      return absl::InvalidArgumentError("give both --h2d_gbps and --d2h_gbps (or --duplex_gbps)");
    }
    return std::vector<LinkRates>{flags};
  }
  const std::string path = absl::GetFlag(FLAGS_link_json);
  if (path.empty()) return std::vector<LinkRates>{};
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError("cannot open --link_json " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<std::vector<LinkRates>> all = ParseLinkJson(text, path);
  if (!all.ok()) return all.status();
  const std::string method = absl::GetFlag(FLAGS_link_method);
  if (method == "best") return all;
  for (const LinkRates& r : *all) {
    if (r.method == method) return std::vector<LinkRates>{r};
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--link_method=%s is not in %s", method, path));
}

// The fastest method's time for these bytes (the link's limit is the best
// it can do); method "" when there are no rates.
struct LinkTime {
  double seconds = 0;
  double mixed_seconds = 0;
  std::string method;
};
LinkTime Fastest(const std::vector<LinkRates>& rates, double h2d, double d2h) {
  LinkTime best;
  for (const LinkRates& r : rates) {
    const double t = LinkBoundSeconds(r, h2d, d2h);
    if (best.method.empty() || t < best.seconds) {
      best = {t, MixedLinkBoundSeconds(r, h2d, d2h), r.method};
    }
  }
  return best;
}

const char* MoveName(ScheduleMove::Kind k) {
  switch (k) {
    case ScheduleMove::Kind::kWriteBack:
      return "write_back";
    case ScheduleMove::Kind::kDrop:
      return "drop";
    case ScheduleMove::Kind::kFetch:
      return "fetch";
  }
  return "?";
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_step);
  if (path.empty()) return Fail("--step is required");
  absl::StatusOr<StepFile> file = ReadStepFile(path);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  const Step& step = file->step;
  const bool repeat = absl::GetFlag(FLAGS_repeat);
  const StepFacts facts = MeasureStep(step, repeat);

  std::vector<Part> parts;
  for (absl::string_view f :
       absl::StrSplit(absl::GetFlag(FLAGS_device_bytes), ',', absl::SkipWhitespace())) {
    absl::StatusOr<std::uint64_t> b = ParseSize(f);
    if (!b.ok()) return Fail("--device_bytes: " + std::string(b.status().message()));
    parts.push_back({std::string(absl::StripAsciiWhitespace(f)), *b});
  }
  std::string fractions = absl::GetFlag(FLAGS_fractions);
  if (fractions.empty() && parts.empty()) fractions = "1.0,0.67,0.33";
  absl::StatusOr<std::vector<double>> fr = ParseDoubles(fractions, "fractions");
  if (!fr.ok()) return Fail(std::string(fr.status().message()));
  for (double x : *fr) {
    parts.push_back({absl::StrFormat("%.3g of peak", x),
                     static_cast<std::uint64_t>(x * static_cast<double>(facts.live_peak))});
  }
  absl::StatusOr<std::vector<double>> measured =
      ParseDoubles(absl::GetFlag(FLAGS_measured_s), "measured_s");
  if (!measured.ok()) return Fail(std::string(measured.status().message()));
  if (!measured->empty() && measured->size() != parts.size()) {
    return Fail(absl::StrFormat("--measured_s has %d values for %d device parts",
                                measured->size(), parts.size()));
  }
  absl::StatusOr<std::vector<LinkRates>> rates = Rates();
  if (!rates.ok()) return Fail(std::string(rates.status().message()));
  double in_memory_s = absl::GetFlag(FLAGS_in_memory_s);
  if (in_memory_s == 0 && file->meta.contains("in_memory_s") &&
      !absl::SimpleAtod(file->meta.at("in_memory_s"), &in_memory_s)) {
    return Fail("the step file's in_memory_s is not a number");
  }

  Json out = {{"step", path},
              {"repeat", repeat},
              {"meta", file->meta},
              {"allocations", step.allocations().size()},
              {"events", step.events().size()},
              {"uses", facts.uses},
              {"live_peak_bytes", facts.live_peak},
              {"working_peak_bytes", facts.working_peak},
              {"largest_use_bytes", facts.largest_use},
              {"carried_freed_used", facts.carried_freed_used},
              {"carried_freed_used_bytes", facts.carried_freed_used_bytes},
              {"in_memory_s", in_memory_s},
              {"parts", Json::array()}};
  for (const LinkRates& r : *rates) {
    out["link"][r.method] = {{"h2d_gbps", r.h2d},
                             {"d2h_gbps", r.d2h},
                             {"duplex_total_gbps", r.duplex_total},
                             {"h2d_alone_gbps", r.h2d_alone},
                             {"d2h_alone_gbps", r.d2h_alone}};
  }
  std::printf("step %s: %zu allocations, %zu events, %lld kernels; live peak %.3f GiB, "
              "working peak %.3f GiB, largest kernel %.3f GiB; %s\n",
              path.c_str(), step.allocations().size(), step.events().size(),
              static_cast<long long>(facts.uses), facts.live_peak / kGiB,
              facts.working_peak / kGiB, facts.largest_use / kGiB,
              repeat ? "steady state of a repeating step" : "one step from a cold start");
  if (facts.carried_freed_used > 0) {
    std::printf("note: %zu carried allocations (%.3f GiB) are used and then freed: each starts "
                "on the host every step\n",
                facts.carried_freed_used, facts.carried_freed_used_bytes / kGiB);
  }
  if (rates->empty()) std::printf("no link rates given: bytes only\n");
  std::printf("%-14s %9s | %9s %9s | %9s %9s | %9s %9s %9s | %s\n", "device part", "GiB",
              "H2D GB", "D2H GB", "H2D>= GB", "D2H>= GB", "link s", "link>= s", "bound s",
              measured->empty() ? "" : "s/step  of in-mem  of bound");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    ScheduleOptions o;
    o.device_bytes = p.bytes;
    o.repeat = repeat;
    o.record_moves = absl::GetFlag(FLAGS_moves);
    Json row = {{"part", p.label}, {"device_bytes", p.bytes}};
    absl::StatusOr<OfflineSchedule> sched = PlanOfflineSchedule(step, o);
    absl::StatusOr<LinkLowerBound> lb = LowerBoundLinkBytes(step, o);
    if (!sched.ok() || !lb.ok()) {
      const std::string why(!sched.ok() ? sched.status().message() : lb.status().message());
      std::printf("%-14s %9.3f | infeasible: %s\n", p.label.c_str(), p.bytes / kGiB, why.c_str());
      row["infeasible"] = why;
      out["parts"].push_back(row);
      continue;
    }
    const double h = sched->h2d_per_step(), d = sched->d2h_per_step();
    row["schedule"] = {{"h2d_bytes", h},
                       {"d2h_bytes", d},
                       {"cycle_steps", sched->steps},
                       {"steady", sched->steady},
                       {"peak_resident_bytes", sched->peak_resident},
                       {"never_resident", sched->never_resident.size()}};
    row["lower_bound"] = {{"h2d_bytes", lb->h2d}, {"d2h_bytes", lb->d2h},
                          {"cold_h2d_bytes", lb->cold_h2d}, {"window_steps", lb->window_steps}};
    std::string line = absl::StrFormat("%-14s %9.3f | %9.3f %9.3f | %9.3f %9.3f |", p.label,
                                       p.bytes / kGiB, h / 1e9, d / 1e9, lb->h2d / 1e9,
                                       lb->d2h / 1e9);
    if (!rates->empty()) {
      const LinkTime ts = Fastest(*rates, h, d), tb = Fastest(*rates, lb->h2d, lb->d2h);
      const double bound = std::max(in_memory_s, tb.seconds);
      row["schedule"]["link_s"] = ts.seconds;
      row["schedule"]["link_mixed_s"] = ts.mixed_seconds;
      row["schedule"]["link_method"] = ts.method;
      row["schedule"]["bound_s"] = std::max(in_memory_s, ts.seconds);
      row["lower_bound"]["link_s"] = tb.seconds;
      row["lower_bound"]["link_mixed_s"] = tb.mixed_seconds;
      row["lower_bound"]["link_method"] = tb.method;
      row["lower_bound"]["bound_s"] = bound;
      line += absl::StrFormat(" %9.4f %9.4f %9.4f |", ts.seconds, tb.seconds, bound);
      if (!measured->empty()) {
        const double m = (*measured)[i];
        row["measured_s"] = m;
        row["of_in_memory_speed"] = in_memory_s > 0 ? in_memory_s / m : 0;
        row["of_bound_speed"] = bound / m;
        line += absl::StrFormat(" %.4f  %.3f  %.3f", m, in_memory_s / m, bound / m);
      }
    }
    if (o.record_moves) {
      Json moves = Json::array();
      for (const ScheduleMove& m : sched->moves) {
        moves.push_back({{"kind", MoveName(m.kind)}, {"before_event", m.before_event},
                         {"id", m.id}, {"bytes", m.bytes}});
      }
      row["schedule"]["moves"] = moves;
    }
    std::printf("%s%s\n", line.c_str(), sched->steady ? "" : "  (no steady cycle found)");
    out["parts"].push_back(row);
  }
  std::printf("GB = 1e9 bytes per step; >=: the lower bound; link s: max(H2D/h2d, D2H/d2h) at the "
              "rates with both directions at once%s; bound s: max(in-memory %.4f s, link>= s)\n",
              rates->size() > 1 ? " (fastest method)" : "", in_memory_s);
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
    if (!f) return Fail("cannot write " + json_path);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace cma

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "link_limit --step=FILE [--fractions=1.0,0.67,0.33 | --device_bytes=...] "
      "[--link_json=FILE | --h2d_gbps=X --d2h_gbps=Y] [--in_memory_s=S] [--json=FILE]");
  absl::ParseCommandLine(argc, argv);
  return cma::Run();
}
