#include "bench/trace.h"

#include <zlib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cma {

absl::StatusOr<std::vector<TraceOp>> ParseTrace(absl::string_view text, absl::string_view name) {
  std::vector<TraceOp> ops;
  int line_no = 0;
  bool header = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (!header) {
      if (line != "seq,action,addr,size,stream") {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": expected header 'seq,action,addr,size,stream', got '", line, "'"));
      }
      header = true;
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    TraceOp op;
    std::uint64_t seq;
    if (f.size() != 5 || !absl::SimpleAtoi(f[0], &seq) || !absl::SimpleAtoi(f[2], &op.addr) ||
        !absl::SimpleAtoi(f[3], &op.size) || !absl::SimpleAtoi(f[4], &op.stream) ||
        (f[1] != "alloc" && f[1] != "free")) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ":", line_no, ": malformed trace line '", line, "'"));
    }
    op.alloc = f[1] == "alloc";
    ops.push_back(op);
  }
  if (!header) return absl::InvalidArgumentError(absl::StrCat(name, ": empty trace"));
  return ops;
}

absl::StatusOr<std::string> ReadMaybeGzipped(const std::string& path, absl::string_view what) {
  // gzopen reads plain files too.
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot open ", what, " ", path));
  std::string text;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) text.append(buf, n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed) {
    return absl::InvalidArgumentError(absl::StrCat("cannot decompress ", what, " ", path));
  }
  return text;
}

absl::StatusOr<std::vector<TraceOp>> ReadTrace(const std::string& path) {
  auto text = ReadMaybeGzipped(path, "trace");
  if (!text.ok()) return text.status();
  return ParseTrace(*text, path);
}

}  // namespace cma
