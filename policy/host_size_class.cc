#include "policy/host_size_class.h"

#include <limits>

namespace cma {

std::size_t HostRound(std::size_t bytes) {
  if (bytes == 0 || bytes > std::numeric_limits<std::size_t>::max() - kHostSlabSize) return 0;
  if (bytes > kHostMaxChunk) return (bytes + kHostSlabSize - 1) / kHostSlabSize * kHostSlabSize;
  std::size_t r = kHostMinChunk;
  while (r < bytes) r <<= 1;
  return r;
}

int HostChunkClass(std::size_t rounded) {
  if (rounded < kHostMinChunk || rounded > kHostMaxChunk) return -1;
  int c = 0;
  for (std::size_t r = kHostMinChunk; r < rounded; r <<= 1) ++c;
  return (kHostMinChunk << c) == rounded ? c : -1;
}

bool HostSegmentCanServe(std::size_t segment_size, std::size_t rounded) {
  return segment_size >= rounded && segment_size - rounded <= rounded / 8;
}

}  // namespace cma
