#include "allocator/transfer_thread.h"

#include <utility>

namespace cma {

TransferThread::TransferThread() : thread_([this] { Run(); }) {}

TransferThread::~TransferThread() {
  Drain();
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  queued_.notify_one();
  thread_.join();
}

std::uint64_t TransferThread::Submit(Call call) {
  std::uint64_t ticket;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(call));
    ticket = ++submitted_;
  }
  queued_.notify_one();
  return ticket;
}

void TransferThread::WaitIssued(std::uint64_t ticket) {
  std::unique_lock<std::mutex> l(mu_);
  issued_.wait(l, [&] { return done_ >= ticket; });
}

void TransferThread::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  const std::uint64_t last = submitted_;
  issued_.wait(l, [&] { return done_ >= last; });
}

std::vector<std::uint64_t> TransferThread::TakeFailures(absl::Status* last) {
  std::lock_guard<std::mutex> l(mu_);
  if (last != nullptr) *last = last_error_;
  return std::exchange(failed_, {});
}

bool TransferThread::HasFailures() {
  std::lock_guard<std::mutex> l(mu_);
  return !failed_.empty();
}

void TransferThread::Run() {
  for (;;) {
    Call call;
    {
      std::unique_lock<std::mutex> l(mu_);
      queued_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, and nothing left
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status s = std::move(call)();
    {
      std::lock_guard<std::mutex> l(mu_);
      ++done_;
      if (!s.ok()) {
        failed_.push_back(done_);  // calls are made in ticket order
        last_error_ = std::move(s);
      }
    }
    issued_.notify_all();
  }
}

}  // namespace cma
