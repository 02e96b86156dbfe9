// Adversarial review of learn_transfer_thread:1 (allocator/transfer_thread.h):
// reproducers on the host backend, wrapped so that the transfer thread's
// calls can be held (as the driver's blocking prefetch holds them) or fail.
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "allocator/caching_managed_allocator.h"
#include "backends/host/host_backend.h"
#include "gtest/gtest.h"
#include "tests/gate_backend.h"
#include "tests/test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kLayers = 8;
constexpr std::size_t kParam = 12 * kMiB;
constexpr std::size_t kAct = 12 * kMiB;

class TransferReviewTest : public ::testing::Test {
 protected:
  void Make(const std::string& extra) {
    auto a = CachingManagedAllocator::Create(
        gate_, "oversubscribe:1,learn_step:1,managed_budget:1G,device_headroom:96M" + extra);
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(*a);
    s_ = *host_.CreateStream(0);
    for (int i = 0; i < kLayers; ++i) {
      auto p = alloc_->Allocate(kParam, 0, s_);
      ASSERT_TRUE(p.ok()) << p.status();
      params_.push_back(*p);
      std::memset(*p, 'a' + i, kParam);
    }
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());
  }
  void TearDown() override {
    if (alloc_) {
      for (void* p : params_) EXPECT_TRUE(alloc_->Free(p).ok());
      EXPECT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
      alloc_.reset();
    }
  }
  void Use(std::vector<void*> ptrs) { ASSERT_TRUE(alloc_->NoteUses(0, ptrs, s_).ok()); }
  // One training step (as tests/learn_step_fixture.h); `after` runs after
  // every event.
  void Step(const std::function<void()>& after = [] {}) {
    std::vector<void*> acts;
    for (int i = 0; i < kLayers; ++i) {
      auto a = alloc_->Allocate(kAct, 0, s_);
      ASSERT_TRUE(a.ok()) << a.status();
      after();
      Use(i == 0 ? std::vector<void*>{params_[i], *a}
                 : std::vector<void*>{params_[i], *a, acts.back()});
      after();
      acts.push_back(*a);
    }
    for (int i = kLayers - 1; i >= 0; --i) {
      Use({params_[i], acts[i]});
      after();
      ASSERT_TRUE(alloc_->Free(acts[i]).ok());
      after();
    }
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());
  }

  HostBackend host_{{.device_count = 1, .device_capacity = 256 * kMiB}};
  GateBackend gate_{host_};
  std::unique_ptr<CachingManagedAllocator> alloc_;
  Stream s_ = 0;
  std::vector<void*> params_;
};

// A pool context that may be a CUDA graph capture begins while a learned
// bring-back's calls are still queued on the transfer thread: nothing drains
// them, so the thread makes its prefetch and RecordEvent while the
// allocator is quiet (docs/pytorch.md: no query, event, sync, prefetch ...
// while a capture may be under way).
TEST_F(TransferReviewTest, TransferCallsAreNotMadeDuringACapture) {
  Make(",learn_transfer_thread:1");
  for (int i = 0; i < 3; ++i) Step();
  ASSERT_GT(alloc_->GetStats(0)->brought_back_bytes, 0) << "the plan brings data back";
  const Stream other = *host_.CreateStream(0);
  bool captured = false;
  gate_.delay_ms = 20;  // each of the thread's calls takes 20 ms
  Step([&] {
    if (captured) return;
    // Wait a little for the thread to be inside a bring-back's call.
    for (int i = 0; i < 20 && gate_.busy.load() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (gate_.busy.load() == 0) return;
    // A capture begins while the thread is in a call with more queued
    // (the fetch events' records follow every bring-back's prefetch).
    captured = true;
    host_.SetCapturing(other, true);
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, {1, 0}, [other](Stream t) { return t == other; })
                    .ok());
    gate_.capture_under_way = true;
    // The capture goes on a while (kernels captured on `other`).
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate_.capture_under_way = false;
    host_.SetCapturing(other, false);
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, {1, 0}).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, {1, 0}).ok());
  });
  gate_.delay_ms = 0;
  ASSERT_TRUE(captured) << "no bring-back was handed to the transfer thread";
  EXPECT_EQ(gate_.calls_during_capture.load(), 0)
      << "the transfer thread made backend calls while a pool context (a capture) was open";
  ASSERT_TRUE(host_.SynchronizeStream(other).ok());
  ASSERT_TRUE(host_.DestroyStream(other).ok());
}


// A bring-back whose call fails on the transfer thread was already counted
// on the device (its accounting happens at once, on the reporting thread).
// At the next event the allocator collects the failure: an allocation no
// use has touched since counts as away again and as a learned miss, and the
// failure is a placement error. (Found by review: the failure was only
// noted, the allocations stayed counted on the device, no miss.)
TEST_F(TransferReviewTest, AFailedBringBackCountsAwayAgainAndAsAMiss) {
  Make(",learn_transfer_thread:1");
  for (int i = 0; i < 3; ++i) Step();
  const DeviceStats before = *alloc_->GetStats(0);
  ASSERT_GT(before.brought_back_bytes, 0) << "the plan brings data back";
  gate_.fail_other_thread_prefetch = true;
  // After every event the transfer thread has made what it was handed.
  Step([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
  gate_.fail_other_thread_prefetch = false;
  const DeviceStats after = *alloc_->GetStats(0);
  ASSERT_GT(gate_.failed.load(), 0) << "no bring-back call was made by the thread";
  EXPECT_GT(after.num_placement_errors, before.num_placement_errors);
  EXPECT_GT(after.learned_misses, before.learned_misses)
      << "failed bring-backs are not counted as misses";
  EXPECT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
  // Without failures the next steps bring data back again.
  Step();
  EXPECT_GT(alloc_->GetStats(0)->brought_back_bytes, after.brought_back_bytes);
}

// A refused call changes nothing (caching_managed_allocator.h: "changes
// nothing if one fails ... a bad stream"). With a bring-back's failure
// still uncollected on the transfer thread, Sleep, Wake and SetAway drain
// it (counting it in num_placement_errors, setting the last placement
// error) before they check their stream, so a call refused for a bad
// stream changes the stats.
TEST_F(TransferReviewTest, ARefusedCallChangesNothingWithAFailureUncollected) {
  Make(",learn_transfer_thread:1");
  for (int i = 0; i < 3; ++i) Step();
  gate_.fail_other_thread_prefetch = true;
  const Stream bogus = 0xdead0;
  bool tried = false;
  Step([&] {
    if (tried || gate_.failed.load() == 0) return;
    tried = true;
    gate_.fail_other_thread_prefetch = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the thread is done
    const std::string before = Fingerprint(*alloc_);
    const std::int64_t errors = alloc_->GetStats(0)->num_placement_errors;
    EXPECT_FALSE(alloc_->Sleep(0, bogus).ok());
    EXPECT_TRUE(Fingerprint(*alloc_) == before)
        << "a Sleep refused for its stream changed the state: num_placement_errors " << errors
        << " -> " << alloc_->GetStats(0)->num_placement_errors;
  });
  gate_.fail_other_thread_prefetch = false;
  ASSERT_TRUE(tried) << "no bring-back call failed";
}

}  // namespace
}  // namespace cma
