// The away state (allocator/away.cc) on the host backend: SendAway and
// BringBack move an allocation's inner pages, the counts follow, the budget
// gains the room, data survives every path (free, reuse, Move, Sleep), and
// bad input changes nothing.
#include <cstring>

#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr std::size_t kMiB = std::size_t{1} << 20;

class AwayTest : public AllocatorTest {
 protected:
  void SetUp() override { Remake(""); }
  void Remake(const std::string& config) {
    if (alloc_ && s_ != 0) backend_->DestroyStream(s_).IgnoreError();
    Make({.device_count = 1, .device_capacity = std::size_t{1} << 30}, config);
    s_ = *backend_->CreateStream(0);
    side_ = *backend_->CreateStream(0);
  }
  absl::Status Away(void* p) { return alloc_->SendAway({&p, 1}, side_); }
  absl::Status Back(void* p) { return alloc_->BringBack({&p, 1}, side_); }
  void Fill(void* p, std::size_t n, char c) {
    ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
    std::memset(p, c, n);
  }
  bool Holds(void* p, std::size_t n, char c) {
    EXPECT_TRUE(backend_->SynchronizeStream(side_).ok());
    const char* q = static_cast<const char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      if (q[i] != c) return false;
    }
    return true;
  }
  // Where the page at `offset` bytes into `p` is.
  int PageAt(void* p, std::size_t offset) {
    return backend_->PageLocation(static_cast<char*>(p) + offset);
  }
  std::int64_t Reserved() { return Stats().reserved_bytes[kAllPools].current; }
  std::int64_t AwayBytes() { return Stats().away_bytes[kAllPools].current; }

  Stream s_ = 0;
  Stream side_ = 0;
};

TEST_F(AwayTest, SendAwayMovesTheInnerPagesAndTheCountsFollow) {
  void* a = Alloc(20 * kMiB, 0, s_);
  Fill(a, 20 * kMiB, 'a');
  const std::int64_t reserved = Reserved();
  ASSERT_TRUE(Away(a).ok());
  ExpectInvariants();
  // A 20 MiB block at a page boundary spans pages 0..9: 1..8 go.
  EXPECT_EQ(AwayBytes(), static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(Reserved(), reserved - static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(Stats().sent_away_bytes, static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(PageAt(a, 4 * kMiB), kPageOnHost);
  EXPECT_EQ(PageAt(a, 0), 0) << "the first page may be shared: it stays";
  EXPECT_EQ(PageAt(a, 19 * kMiB), 0) << "so does the last";
  EXPECT_TRUE(Holds(a, 20 * kMiB, 'a'));
  // Sending it again is a no-op.
  ASSERT_TRUE(Away(a).ok());
  EXPECT_EQ(Stats().sent_away_bytes, static_cast<std::int64_t>(16 * kMiB));

  ASSERT_TRUE(Back(a).ok());
  ExpectInvariants();
  EXPECT_EQ(AwayBytes(), 0);
  EXPECT_EQ(Reserved(), reserved);
  EXPECT_EQ(Stats().brought_back_bytes, static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(PageAt(a, 4 * kMiB), 0);
  EXPECT_TRUE(Holds(a, 20 * kMiB, 'a'));
  ASSERT_TRUE(Back(a).ok());  // not away: a no-op
  EXPECT_EQ(Stats().brought_back_bytes, static_cast<std::int64_t>(16 * kMiB));
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(AwayTest, AnAllocationOfFewerThanThreePagesHasNothingToSend) {
  void* a = Alloc(3 * kMiB, 0, s_);
  void* b = Alloc(100, 0, s_);
  const std::string before = Fingerprint(*alloc_);
  void* both[] = {a, b};
  ASSERT_TRUE(alloc_->SendAway(both, side_).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);
  for (void* p : both) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(AwayTest, TheRoomItFreesServesOtherAllocationsAndBringBackNeedsItAgain) {
  Remake("managed_budget:64M");
  void* a = Alloc(40 * kMiB, 0, s_);
  Fill(a, 40 * kMiB, 'x');
  EXPECT_FALSE(alloc_->Allocate(30 * kMiB, 0, s_).ok()) << "no room before";
  ASSERT_TRUE(Away(a).ok());
  auto b = alloc_->Allocate(30 * kMiB, 0, s_);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectInvariants();
  // No room to bring it back: refused, nothing changes.
  const std::string before = Fingerprint(*alloc_);
  absl::Status s = Back(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("send something away first"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Free(*b).ok());
  // Now the freed block's pages are idle cache: bringing back discards them.
  ASSERT_TRUE(Back(a).ok());
  ExpectInvariants();
  EXPECT_LE(Reserved(), static_cast<std::int64_t>(64 * kMiB));
  EXPECT_TRUE(Holds(a, 40 * kMiB, 'x'));
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(AwayTest, TheFreeOfAnAwayAllocationForgetsItsPagesAndTheBlockIsReusedWhole) {
  void* a = Alloc(20 * kMiB, 0, s_);
  // On its own stream: the free needs no event and forgets it at once.
  ASSERT_TRUE(alloc_->SendAway({&a, 1}, s_).ok());
  const std::int64_t discarded = Stats().discarded_bytes;
  ASSERT_TRUE(alloc_->Free(a).ok());
  ExpectInvariants();
  EXPECT_EQ(AwayBytes(), 0);
  EXPECT_EQ(Stats().discarded_bytes, discarded + static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(PageAt(a, 4 * kMiB), kPageUnpopulated) << "dead data is not kept on the host";
  void* b = Alloc(20 * kMiB, 0, s_);
  EXPECT_EQ(b, a);
  ExpectInvariants();
  EXPECT_EQ(PageAt(b, 4 * kMiB), 0) << "populated on the device again when handed out";
  Fill(b, 20 * kMiB, 'b');
  ASSERT_TRUE(alloc_->Free(b).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

TEST_F(AwayTest, AnotherStreamsTransferIsAUseTheFreeWaitsFor) {
  void* a = Alloc(20 * kMiB, 0, s_);
  ASSERT_TRUE(Away(a).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  // Freed while `side_` may still be moving it: the block waits for an
  // event on `side_` before any stream reuses it.
  EXPECT_EQ(Stats().active_bytes[kAllPools].current, static_cast<std::int64_t>(20 * kMiB));
  ASSERT_TRUE(backend_->SynchronizeStream(side_).ok());
  void* b = Alloc(20 * kMiB, 0, s_);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(AwayTest, AMoveOrASleepCountsAnAwayAllocationBackAndKeepsItsData) {
  void* a = Alloc(20 * kMiB, 0, s_);
  void* b = Alloc(20 * kMiB, 0, s_);
  Fill(a, 20 * kMiB, 'a');
  Fill(b, 20 * kMiB, 'b');
  const std::int64_t reserved = Reserved();
  void* both[] = {a, b};
  ASSERT_TRUE(alloc_->SendAway(both, side_).ok());
  EXPECT_EQ(AwayBytes(), static_cast<std::int64_t>(32 * kMiB));
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s_).ok());
  ExpectInvariants();
  EXPECT_EQ(AwayBytes(), static_cast<std::int64_t>(16 * kMiB));
  EXPECT_EQ(PageAt(a, 4 * kMiB), 0);
  ASSERT_TRUE(alloc_->Sleep(0, s_).ok());
  ExpectInvariants();
  EXPECT_EQ(AwayBytes(), 0);
  ASSERT_TRUE(alloc_->Wake(0, s_).ok());
  ExpectInvariants();
  EXPECT_EQ(Reserved(), reserved);
  ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
  EXPECT_TRUE(Holds(a, 20 * kMiB, 'a'));
  EXPECT_TRUE(Holds(b, 20 * kMiB, 'b'));
  for (void* p : both) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(AwayTest, TiedPointersMoveOnce) {
  void* a = Alloc(20 * kMiB, 0, s_);
  void* twice[] = {a, a};
  ASSERT_TRUE(alloc_->SendAway(twice, side_).ok());
  EXPECT_EQ(AwayBytes(), static_cast<std::int64_t>(16 * kMiB));
  ExpectInvariants();
  ASSERT_TRUE(alloc_->BringBack(twice, side_).ok());
  EXPECT_EQ(AwayBytes(), 0);
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(AwayTest, BadInputIsRefusedByNameAndChangesNothing) {
  void* a = Alloc(20 * kMiB, 0, s_);
  auto host = alloc_->Allocate(8 * kMiB, CachingManagedAllocator::kHostDevice);
  ASSERT_TRUE(host.ok());
  const std::string before = Fingerprint(*alloc_);
  int local = 0;
  void* foreign[] = {a, &local};
  absl::Status s = alloc_->SendAway(foreign, side_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("not an allocation of this allocator"));
  void* inner[] = {static_cast<char*>(a) + 4096};
  EXPECT_EQ(alloc_->SendAway(inner, side_).code(), absl::StatusCode::kInvalidArgument);
  void* just_a[] = {a};
  s = alloc_->SendAway(just_a, Stream{0xbad});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("invalid stream"));
  void* host_one[] = {a, *host};
  s = alloc_->SendAway(host_one, side_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("host pool"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_EQ(PageAt(a, 4 * kMiB), 0);
  ASSERT_TRUE(alloc_->Free(*host).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(AwayTest, ABatchWithOneRefusedPointerMovesNothing) {
  void* a = Alloc(20 * kMiB, 0, s_);
  void* b = Alloc(20 * kMiB, 0, s_);
  ASSERT_TRUE(alloc_->Free(b).ok());
  const std::string before = Fingerprint(*alloc_);
  void* batch[] = {a, b};  // b was freed
  absl::Status s = alloc_->SendAway(batch, side_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_EQ(PageAt(a, 4 * kMiB), 0);
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(AwayTest, ClassicSegmentsAndPrivatePoolsCannotBeAway) {
  Remake("segments:classic");
  void* a = Alloc(20 * kMiB, 0, s_);
  absl::Status s = Away(a);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("segments:arena"));
  ASSERT_TRUE(alloc_->Free(a).ok());

  Remake("");
  constexpr MemPoolId kPool{1, 0};
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* p = Alloc(20 * kMiB, 0, s_);
  s = Away(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  s = Away(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("private pool"));
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_F(AwayTest, AKernelThatTouchesAnAwayAllocationStillSeesItsData) {
  void* a = Alloc(20 * kMiB, 0, s_);
  Fill(a, 20 * kMiB, 'k');
  ASSERT_TRUE(Away(a).ok());
  // The host backend's "kernel": a write through the pointer, as the GPU's
  // fault path would migrate the page back and write it.
  ASSERT_TRUE(backend_->SynchronizeStream(side_).ok());
  static_cast<char*>(a)[8 * kMiB] = 'z';
  ASSERT_TRUE(Back(a).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(side_).ok());
  EXPECT_EQ(static_cast<char*>(a)[8 * kMiB], 'z');
  EXPECT_EQ(static_cast<char*>(a)[8 * kMiB + 1], 'k');
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(a).ok());
}

// The room a bring back needs may include a page that free blocks of two
// streams share, while both streams still have kernels queued: the page is
// discarded on the bringing stream after it waits for both streams on the
// GPU, never by the host waiting (which would drain the queue the caller
// has launched ahead).
TEST_F(AwayTest, RoomOnAPageOfTwoStreamsIsMadeWithoutAHostWait) {
  Make({.device_count = 1, .device_capacity = std::size_t{1} << 30, .manual_completion = true},
       "managed_budget:16M");
  s_ = *backend_->CreateStream(0);
  side_ = *backend_->CreateStream(0);
  const Stream other = *backend_->CreateStream(0);
  void* x = Alloc(3 * kMiB, 0, s_);    // pages 0-1
  void* y = Alloc(3 * kMiB, 0, other);  // pages 1-2: page 1 is shared
  void* a = Alloc(10 * kMiB, 0, s_);   // pages 3-7, inner pages 4-6
  ASSERT_EQ(static_cast<char*>(y), static_cast<char*>(x) + 3 * kMiB);
  ASSERT_EQ(static_cast<char*>(a), static_cast<char*>(y) + 3 * kMiB);
  ASSERT_TRUE(Away(a).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(side_).ok());
  void* c = Alloc(6 * kMiB, 0, s_);  // pages 8-10: the budget is full
  ASSERT_NE(c, nullptr);
  // Kernels still queued on both streams when their blocks are freed.
  ASSERT_TRUE(backend_->EnqueueWork(s_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(other).ok());
  ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->Free(y).ok());
  ASSERT_EQ(Stats().idle_populated_bytes, static_cast<std::int64_t>(6 * kMiB));
  backend_->ClearRecords();
  const std::int64_t syncs = backend_->CallCount("SynchronizeStream") +
                             backend_->CallCount("SynchronizeEvent");
  ASSERT_TRUE(Back(a).ok()) << "three pages are needed, the shared one among them";
  EXPECT_EQ(backend_->CallCount("SynchronizeStream") + backend_->CallCount("SynchronizeEvent"),
            syncs);
  EXPECT_GT(backend_->PendingWork(s_), 0) << "the host waited for the queued kernel";
  EXPECT_GT(backend_->PendingWork(other), 0) << "the host waited for the queued kernel";
  // The shared page's discard comes after the bringing stream waited for
  // both streams' queued kernels.
  const std::uintptr_t shared = reinterpret_cast<std::uintptr_t>(x) + 2 * kMiB;
  std::uint64_t discard_seq = 0;
  for (const PlacementRecord& r : backend_->Records()) {
    const auto lo = reinterpret_cast<std::uintptr_t>(r.ptr);
    if (r.op == PlacementRecord::Op::kDiscard && lo <= shared && shared < lo + r.bytes) {
      EXPECT_EQ(r.stream, side_);
      discard_seq = r.seq;
    }
  }
  ASSERT_NE(discard_seq, 0u) << "the shared page was not discarded";
  for (Stream owner : {s_, other}) {
    bool waited = false;
    for (const StreamWaitRecord& w : backend_->Waits()) {
      waited |= w.stream == side_ && w.on == owner && w.ticket >= 1 && w.seq < discard_seq;
    }
    EXPECT_TRUE(waited) << "no wait for stream " << owner;
  }
  ExpectInvariants();
  ASSERT_TRUE(backend_->CompleteWork(s_).ok());
  ASSERT_TRUE(backend_->CompleteWork(other).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(c).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(side_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
  alloc_.reset();
  for (Stream st : {s_, side_, other}) ASSERT_TRUE(backend_->DestroyStream(st).ok());
  s_ = side_ = 0;
}

}  // namespace
}  // namespace cma
