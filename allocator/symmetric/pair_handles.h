// Internal to the symmetric heap (symmetric_heap.cc): a member's memory
// exported for every pair of processes across hosts, and imported as each
// pair allows (an FD within a host, a fabric handle within an NVLink
// domain, else unreachable).
#ifndef CMA_ALLOCATOR_SYMMETRIC_PAIR_HANDLES_H_
#define CMA_ALLOCATOR_SYMMETRIC_PAIR_HANDLES_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "allocator/symmetric/exchange.h"
#include "backends/backend.h"

namespace cma {
namespace symmetric_internal {

// Fixed-size values appended to and read from a round's bytes (the heap's
// and the per-pair handles' records): Get is false, reading nothing, when
// fewer than sizeof(T) bytes remain at `pos`.
template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
bool Get(const std::string& in, std::size_t& pos, T& v) {
  if (pos + sizeof(v) > in.size()) return false;
  std::memcpy(&v, in.data() + pos, sizeof(v));
  pos += sizeof(v);
  return true;
}

// Accumulates seconds per named step of a cache miss.
class StepClock {
 public:
  explicit StepClock(std::map<std::string, double>& out) : out_(out) { out_.clear(); }
  template <typename F>
  auto Time(const char* step, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = f();
    out_[step] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

 private:
  std::map<std::string, double>& out_;
};

// Across hosts: one member's memory, exported for every pair, as
// {rank, has_fd, has_fabric, 64 fabric bytes} with its FD (if any) in
// `mine.fds`: a fabric heap sends its fabric handle for members of other
// hosts and, where the memory can also be exported as one, an FD for this
// host's (a fabric-only CUDA allocation cannot: this host's members then
// import the fabric handle too).
absl::Status ExportPerPair(Backend& backend, HandleType type, PhysicalHandle h, int rank,
                           StepClock& clock, Contribution& mine, std::vector<int>& fds_to_close);

// Where this process stands across hosts, for ImportPerPair.
struct PairView {
  Backend& backend;
  const Exchange& exchange;
  const std::string& fabric_domain;  // this process's; empty: none known
  int world;
  std::size_t stride;
};

// Process p's members, as ExportPerPair sent them (`pos` is past the count
// and the type): each imported as the pair allows (an FD within this host;
// a fabric handle within this host or this NVLink domain), or marked
// unreachable, with the reason. Every byte is checked before use.
absl::Status ImportPerPair(const PairView& v, const Contribution& c, int p, std::size_t pos,
                           std::uint32_t n, StepClock& clock, std::vector<PhysicalHandle>& handles,
                           std::vector<bool>& have, std::vector<bool>& unreachable,
                           std::vector<std::string>& why);

}  // namespace symmetric_internal
}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_PAIR_HANDLES_H_
