// TransferThread: one thread that makes calls handed to it, in the order
// they were handed over, so that a call that blocks its caller (the
// driver's managed prefetch to a full device held the thread reporting a
// PyTorch step's events 0.23-0.47 s a step on the H200) blocks this thread
// instead of the one launching the step's kernels.
//
// Contract: Submit returns a ticket; WaitIssued(t) returns once call t (and
// every call before it) has returned; Drain waits for all. A call that
// returns an error has its ticket and status kept (TakeFailures), since the
// submitter has moved on. Thread safety: every method may be called from
// any thread; calls run one at a time on the transfer thread and must not
// call back into the object that submitted them (they may call a Backend,
// whose methods are safe to call concurrently). The destructor drains.
#ifndef CMA_ALLOCATOR_TRANSFER_THREAD_H_
#define CMA_ALLOCATOR_TRANSFER_THREAD_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace cma {

class TransferThread {
 public:
  using Call = absl::AnyInvocable<absl::Status() &&>;

  TransferThread();
  ~TransferThread();
  TransferThread(const TransferThread&) = delete;
  TransferThread& operator=(const TransferThread&) = delete;

  std::uint64_t Submit(Call call);
  void WaitIssued(std::uint64_t ticket);
  void Drain();
  // The tickets of the calls that failed since the last TakeFailures, and
  // the last failure's status; HasFailures: whether there are any.
  std::vector<std::uint64_t> TakeFailures(absl::Status* last);
  bool HasFailures();

 private:
  void Run();

  // A standard mutex and condition variables, not absl::Mutex::Await:
  // ThreadSanitizer cannot see Debian's Abseil wait (backends/mutex_lock.h).
  std::mutex mu_;
  std::condition_variable queued_;  // the transfer thread waits for calls
  std::condition_variable issued_;  // submitters wait for them to be made
  std::deque<Call> queue_;          // guarded by mu_, as every field below
  std::uint64_t submitted_ = 0;
  std::uint64_t done_ = 0;
  std::vector<std::uint64_t> failed_;
  absl::Status last_error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_TRANSFER_THREAD_H_
