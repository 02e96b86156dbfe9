// Reuse inside a CUDA graph capture of a block freed there while other
// streams still used it (PyTorch's graph_capture_record_stream_reuse).
//
// A block freed during a capture whose uses span several streams cannot be
// ordered with events (a capture allows none), so it normally waits until
// the capture's pool context ends. But the capture's graph already says
// when it is safe: once the work captured on the allocating stream depends
// on every node each using stream had reached when the block was freed,
// every captured use of the block happens before anything captured next on
// that stream, in every replay. The free records those nodes (its marks);
// an allocation in the capture reuses the block once all of them are
// ancestors of, or among, the allocating stream's frontier.
//
// Thread safety: CaptureAncestors is a value used under the allocator's
// lock for one allocation; it calls `dependencies` (the backend) only.
#ifndef CMA_ALLOCATOR_CAPTURE_REUSE_H_
#define CMA_ALLOCATOR_CAPTURE_REUSE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backends/backend.h"

namespace cma {

// What a block freed during a capture waits for: the capture, and the nodes
// its streams' captured work had reached at the free.
struct CaptureFree {
  std::uint64_t capture = 0;
  std::vector<CaptureNode> marks;
};

// The ancestors of a frontier, walked backwards lazily (breadth first, only
// as far as a question needs) and remembered for the next question.
class CaptureAncestors {
 public:
  using Dependencies = std::function<absl::StatusOr<std::vector<CaptureNode>>(CaptureNode)>;
  // At most `max_nodes` nodes are visited: a bigger graph answers false
  // (the block waits for the capture's end) rather than cost an allocation
  // a walk of everything.
  CaptureAncestors(absl::Span<const CaptureNode> frontier, Dependencies dependencies,
                   std::size_t max_nodes);
  // Whether every node of `marks` is in the frontier or an ancestor of it.
  // false also when the walk fails or passes its bound.
  bool ReachesAll(absl::Span<const CaptureNode> marks);

 private:
  bool Reaches(CaptureNode node);

  Dependencies dependencies_;
  std::size_t max_nodes_;
  absl::flat_hash_set<CaptureNode> seen_;
  std::deque<CaptureNode> to_expand_;
  bool failed_ = false;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_CAPTURE_REUSE_H_
