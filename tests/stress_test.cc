// Randomized stress: 8 threads x 4 streams x 2 devices under memory pressure,
// with the invariant checker after every step and a tag in every live block
// that would expose two callers being handed overlapping memory.
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/block_tag.h"
#include "tests/test_util.h"

namespace cma {
namespace {

TEST_F(AllocatorTest, EightThreadsFourStreamsKeepInvariants) {
  Make({.device_count = 2, .device_capacity = 192 << 20, .manual_completion = true});
  std::vector<Stream> streams[2];
  for (int d = 0; d < 2; ++d) {
    streams[d].push_back(kDefaultStream);
    for (int i = 0; i < 3; ++i) streams[d].push_back(*backend_->CreateStream(d));
  }
  constexpr int kThreads = 8;
  constexpr int kSteps = 1000;
  std::atomic<int> failures{0}, ooms{0}, allocs{0};
  std::atomic<std::uint64_t> next_tag{1};
  auto worker = [&](int id) {
    std::mt19937_64 rng(1234 + id);
    std::vector<TaggedBlock> live;
    for (int step = 0; step < kSteps && failures == 0; ++step) {
      const int dev = rng() % 2;
      const Stream s = streams[dev][rng() % 4];
      const int op = rng() % 10;
      if (op < 5 || live.empty()) {
        // Mostly small, sometimes large, rarely huge.
        const int kind = rng() % 20;
        std::size_t n = kind < 14 ? 8 + rng() % 65536
                        : kind < 19 ? (1 << 20) + rng() % (6 << 20)
                                    : (12 << 20) + rng() % (20 << 20);
        auto p = alloc_->Allocate(n, dev, s);
        if (!p.ok()) {
          if (p.status().code() == absl::StatusCode::kResourceExhausted) {
            ++ooms;
          } else {
            ADD_FAILURE() << p.status();
            ++failures;
          }
          continue;
        }
        ++allocs;
        TaggedBlock l{*p, n, next_tag++};
        if (n >= 16) l.Write();  // smaller blocks carry no tag
        live.push_back(l);
      } else if (op < 8) {
        const std::size_t i = rng() % live.size();
        if (live[i].bytes >= 16 && !live[i].Intact()) {
          ADD_FAILURE() << "block " << live[i].ptr << " was overwritten: handed out twice";
          ++failures;
        }
        if (!alloc_->Free(live[i].ptr).ok()) ++failures;
        live[i] = live.back();
        live.pop_back();
      } else if (op < 9) {
        const std::size_t i = rng() % live.size();
        const int d = *alloc_->DeviceOf(live[i].ptr);
        const Stream other = streams[d][rng() % 4];
        if (!alloc_->RecordStream(live[i].ptr, other).ok()) ++failures;
        backend_->EnqueueWork(other).IgnoreError();  // a kernel on `other` uses it
      } else {
        // The "GPU" makes progress on a random stream.
        backend_->CompleteWork(streams[dev][rng() % 4]).IgnoreError();
      }
      absl::Status inv = alloc_->CheckInvariants();
      if (!inv.ok()) {
        ADD_FAILURE() << inv;
        ++failures;
      }
    }
    for (const TaggedBlock& l : live) {
      if (l.bytes >= 16 && !l.Intact()) ++failures;
      if (!alloc_->Free(l.ptr).ok()) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_GT(allocs, kThreads * kSteps / 3);
  ExpectInvariants();
  DeviceStats total = alloc_->GetStats();
  EXPECT_EQ(total.allocation[kAllPools].current, 0);
  EXPECT_EQ(total.num_ooms, ooms.load());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(alloc_->GetStats().reserved_bytes[kAllPools].current, 0);
  alloc_.reset();
  for (int d = 0; d < 2; ++d) {
    for (int i = 1; i < 4; ++i) backend_->DestroyStream(streams[d][i]).IgnoreError();
  }
}

// PyTorch's settings change while threads allocate and free on four streams
// per device with work pending (TSAN runs this test): every reader of the
// shared keys runs under its device's lock, and no block is handed out while
// another stream may still use it (the tags would show it).
TEST_F(AllocatorTest, SettingsChangeWhileThreadsAllocate) {
  Make({.device_count = 2, .device_capacity = 192 << 20, .manual_completion = true});
  std::vector<Stream> streams[2];
  for (int d = 0; d < 2; ++d) {
    streams[d].push_back(kDefaultStream);
    for (int i = 0; i < 3; ++i) streams[d].push_back(*backend_->CreateStream(d));
  }
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::thread changer([&] {
    const char* settings[] = {"roundup_power2_divisions:4", "",
                              "roundup_power2_divisions:[1:8,4:2,8:1],max_split_size_mb:40",
                              "garbage_collection_threshold:0.5,roundup_power2_divisions:2"};
    for (int i = 0; !done.load(); ++i) {
      if (!alloc_->ApplyPyTorchSettings(settings[i % 4]).ok()) ++failures;
    }
  });
  auto worker = [&](int id) {
    std::mt19937_64 rng(77 + id);
    std::vector<TaggedBlock> live;
    for (int step = 0; step < 1000 && failures == 0; ++step) {
      const int dev = rng() % 2;
      const int op = rng() % 10;
      if (op < 5 || live.empty()) {
        const std::size_t n = 16 + rng() % (rng() % 4 == 0 ? (6 << 20) : 65536);
        auto p = alloc_->Allocate(n, dev, streams[dev][rng() % 4]);
        if (!p.ok()) {
          if (p.status().code() != absl::StatusCode::kResourceExhausted) ++failures;
          continue;
        }
        TaggedBlock l{*p, n, static_cast<std::uint64_t>(id) << 32 | step};
        l.Write();
        live.push_back(l);
      } else if (op < 8) {
        const std::size_t i = rng() % live.size();
        if (!live[i].Intact() || !alloc_->Free(live[i].ptr).ok()) ++failures;
        live[i] = live.back();
        live.pop_back();
      } else if (op < 9) {
        const std::size_t i = rng() % live.size();
        const int d = *alloc_->DeviceOf(live[i].ptr);
        const Stream other = streams[d][rng() % 4];
        if (!alloc_->RecordStream(live[i].ptr, other).ok()) ++failures;
        backend_->EnqueueWork(other).IgnoreError();  // a kernel on `other` uses it
      } else {
        backend_->CompleteWork(streams[dev][rng() % 4]).IgnoreError();
      }
      if (!alloc_->CheckInvariants().ok()) ++failures;
    }
    for (const TaggedBlock& l : live) {
      if (!l.Intact() || !alloc_->Free(l.ptr).ok()) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  done = true;
  changer.join();
  EXPECT_EQ(failures, 0);
  ExpectInvariants();
  EXPECT_EQ(alloc_->GetStats().allocation[kAllPools].current, 0);
  alloc_.reset();
  for (int d = 0; d < 2; ++d) {
    for (int i = 1; i < 4; ++i) backend_->DestroyStream(streams[d][i]).IgnoreError();
  }
}

}  // namespace
}  // namespace cma
