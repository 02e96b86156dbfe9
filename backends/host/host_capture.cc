// HostBackend's emulation of CUDA graph capture topology: which streams
// capture, into which capture sequence, and the graph their captured work
// forms. Tests build the graph (AddCaptureNode, JoinCapture) as PyTorch's
// captured kernels and wait_stream calls would; the allocator reads it
// through CaptureFrontierOf and CaptureNodeDependencies, as it reads
// cudaStreamGetCaptureInfo and cudaGraphNodeGetDependencies on CUDA.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "backends/host/host_backend.h"
#include "backends/mutex_lock.h"

namespace cma {

void HostBackend::SetCapturing(Stream stream, bool capturing) {
  MutexLock l(&mu_);
  auto st = FindStream(stream);
  if (!st.ok()) return;
  (*st)->capturing = capturing;
  (*st)->capture = capturing ? next_id_++ : 0;
  (*st)->capture_frontier.clear();
}

CaptureNode HostBackend::AddCaptureNode(Stream stream) {
  MutexLock l(&mu_);
  auto st = FindStream(stream);
  if (!st.ok() || !(*st)->capturing) return 0;
  const CaptureNode node = next_id_++;
  capture_nodes_[node] = (*st)->capture_frontier;
  (*st)->capture_frontier = {node};
  return node;
}

void HostBackend::JoinCapture(Stream waiter, Stream waited) {
  MutexLock l(&mu_);
  auto from = FindStream(waited);
  auto to = FindStream(waiter);
  if (!from.ok() || !to.ok() || !(*from)->capturing) return;
  std::vector<CaptureNode> nodes = (*from)->capture_frontier;
  if ((*to)->capturing && (*to)->capture == (*from)->capture) {
    for (CaptureNode n : (*to)->capture_frontier) {
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
  }
  (*to)->capturing = true;
  (*to)->capture = (*from)->capture;
  (*to)->capture_frontier = std::move(nodes);
}

absl::StatusOr<std::optional<CaptureFrontier>> HostBackend::CaptureFrontierOf(Stream stream) {
  MutexLock l(&mu_);
  Count("CaptureFrontierOf");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  if (!(*st)->capturing) return std::nullopt;
  return CaptureFrontier{(*st)->capture, (*st)->capture_frontier};
}

absl::StatusOr<std::vector<CaptureNode>> HostBackend::CaptureNodeDependencies(CaptureNode node) {
  MutexLock l(&mu_);
  Count("CaptureNodeDependencies");
  auto it = capture_nodes_.find(node);
  if (it == capture_nodes_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CaptureNodeDependencies: %#x is not a captured node", node));
  }
  return it->second;
}

}  // namespace cma
