#include "allocator/capture_reuse.h"

#include <utility>

namespace cma {

CaptureAncestors::CaptureAncestors(absl::Span<const CaptureNode> frontier,
                                   Dependencies dependencies, std::size_t max_nodes)
    : dependencies_(std::move(dependencies)), max_nodes_(max_nodes) {
  for (CaptureNode n : frontier) {
    if (seen_.insert(n).second) to_expand_.push_back(n);
  }
}

bool CaptureAncestors::ReachesAll(absl::Span<const CaptureNode> marks) {
  for (CaptureNode m : marks) {
    if (!Reaches(m)) return false;
  }
  return true;
}

bool CaptureAncestors::Reaches(CaptureNode node) {
  while (!seen_.contains(node)) {
    if (failed_ || to_expand_.empty()) return false;
    const CaptureNode next = to_expand_.front();
    to_expand_.pop_front();
    absl::StatusOr<std::vector<CaptureNode>> deps = dependencies_(next);
    if (!deps.ok()) {
      failed_ = true;
      return false;
    }
    for (CaptureNode d : *deps) {
      if (!seen_.insert(d).second) continue;
      if (seen_.size() > max_nodes_) {
        failed_ = true;
        return false;
      }
      to_expand_.push_back(d);
    }
  }
  return true;
}

}  // namespace cma
