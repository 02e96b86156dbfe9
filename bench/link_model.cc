#include "bench/link_model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace cma {

double LinkBoundSeconds(const LinkRates& r, double h2d_bytes, double d2h_bytes) {
  double t = std::max(h2d_bytes / (r.h2d * 1e9), d2h_bytes / (r.d2h * 1e9));
  if (r.duplex_total > 0) t = std::max(t, (h2d_bytes + d2h_bytes) / (r.duplex_total * 1e9));
  return t;
}

double MixedLinkBoundSeconds(const LinkRates& r, double h2d_bytes, double d2h_bytes) {
  const double both = LinkBoundSeconds(r, h2d_bytes, d2h_bytes);
  if (r.h2d_alone <= 0 || r.d2h_alone <= 0) return both;
  // Time t_b with both directions at once, then each direction alone for
  // what is left: f(t_b) = t_b + left_h2d / alone_h2d + left_d2h /
  // alone_d2h is convex and piecewise linear in t_b, so its least value is
  // at a breakpoint: no time together, or just long enough for one
  // direction to finish.
  const double hs = r.h2d * 1e9, ds = r.d2h * 1e9;
  const double ha = std::max(r.h2d_alone, r.h2d) * 1e9, da = std::max(r.d2h_alone, r.d2h) * 1e9;
  auto total = [&](double tb) {
    return tb + std::max(0.0, h2d_bytes - hs * tb) / ha + std::max(0.0, d2h_bytes - ds * tb) / da;
  };
  double best = std::min({total(0), total(h2d_bytes / hs), total(d2h_bytes / ds)});
  return std::min(best, both);
}

absl::StatusOr<std::vector<LinkRates>> ParseLinkJson(absl::string_view text,
                                                     absl::string_view name) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(name, ": not JSON"));
  if (!j.is_object() || !j.contains("summary") || !j["summary"].is_object() ||
      j["summary"].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": no \"summary\" object of methods (link_duplex_bench's JSON)"));
  }
  std::vector<LinkRates> out;
  for (const auto& [method, m] : j["summary"].items()) {
    LinkRates r;
    r.method = method;
    struct Field {
      const char* key;
      double* to;
    } fields[] = {{"duplex_h2d_gbps", &r.h2d},
                  {"duplex_d2h_gbps", &r.d2h},
                  {"h2d_alone_gbps", &r.h2d_alone},
                  {"d2h_alone_gbps", &r.d2h_alone}};
    for (const Field& f : fields) {
      if (!m.is_object() || !m.contains(f.key) || !m[f.key].is_number() ||
          !(m[f.key].get<double>() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": method \"", method, "\" has no positive number \"", f.key, "\""));
      }
      *f.to = m[f.key].get<double>();
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace cma
