#include "bench/step_file.h"

#include "bench/trace.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cma {
namespace {

constexpr absl::string_view kHeader = "cma_step v1";

// SimpleAtoi takes a sign and surrounding spaces; the format takes digits only.
bool ParseUnsigned(absl::string_view field, std::uint64_t* out) {
  if (field.empty() || !std::all_of(field.begin(), field.end(), absl::ascii_isdigit)) {
    return false;
  }
  return absl::SimpleAtoi(field, out);
}

bool ParseAccess(absl::string_view field, StepAccess* out) {
  const std::size_t colon = field.find(':');
  if (!ParseUnsigned(field.substr(0, colon), &out->id)) return false;
  if (colon == absl::string_view::npos) {
    out->mode = AccessMode::kReadWrite;
    return true;
  }
  const absl::string_view mode = field.substr(colon + 1);
  if (mode == "r") {
    out->mode = AccessMode::kRead;
  } else if (mode == "w") {
    out->mode = AccessMode::kWrite;
  } else if (mode == "rw") {
    out->mode = AccessMode::kReadWrite;
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<StepFile> ParseStepFile(absl::string_view text, absl::string_view name) {
  StepFile out;
  bool header = false;
  std::int64_t line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ":", line_no, ": ", why, ": '", line.substr(0, 200), "'"));
    };
    if (line.empty()) continue;
    if (line[0] == '#') {
      absl::string_view body = absl::StripLeadingAsciiWhitespace(line.substr(1));
      const std::size_t eq = body.find('=');
      if (eq != absl::string_view::npos && eq > 0 &&
          body.substr(0, eq).find(' ') == absl::string_view::npos) {
        out.meta[std::string(body.substr(0, eq))] = std::string(body.substr(eq + 1));
      }
      continue;
    }
    if (!header) {
      if (line != kHeader) return bad(absl::StrCat("expected the header '", kHeader, "'"));
      header = true;
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    const absl::string_view kind = f[0];
    absl::Status s;
    if (kind == "live" || kind == "alloc") {
      std::uint64_t id, bytes;
      if (f.size() != 3 || !ParseUnsigned(f[1], &id) || !ParseUnsigned(f[2], &bytes)) {
        return bad(absl::StrCat("expected '", kind, ",<id>,<bytes>'"));
      }
      s = kind == "live" ? out.step.Live(id, bytes) : out.step.Alloc(id, bytes);
    } else if (kind == "use") {
      if (f.size() < 2) return bad("expected 'use,<id>[:r|:w|:rw],...'");
      std::vector<StepAccess> accesses(f.size() - 1);
      for (std::size_t i = 1; i < f.size(); ++i) {
        if (!ParseAccess(f[i], &accesses[i - 1])) {
          return bad(absl::StrCat("bad access '", f[i], "' (expected <id>, <id>:r, <id>:w or <id>:rw)"));
        }
      }
      s = out.step.Use(accesses);
    } else if (kind == "free") {
      std::uint64_t id;
      if (f.size() != 2 || !ParseUnsigned(f[1], &id)) return bad("expected 'free,<id>'");
      s = out.step.Free(id);
    } else {
      return bad("unknown event (expected live, alloc, use or free)");
    }
    if (!s.ok()) return bad(s.message());
  }
  if (!header) return absl::InvalidArgumentError(absl::StrCat(name, ": empty step (no header)"));
  out.lines = line_no;
  return out;
}

absl::StatusOr<StepFile> ReadStepFile(const std::string& path) {
  auto text = ReadMaybeGzipped(path, "step file");
  if (!text.ok()) return text.status();
  return ParseStepFile(*text, path);
}

}  // namespace cma
