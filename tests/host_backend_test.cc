#include "backends/host/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

TEST(HostBackendTest, ManagedMemoryIsUsableAndCounted) {
  HostBackend b({.device_count = 2, .device_capacity = 64 << 20});
  auto p = b.AllocateManaged(1, 4 << 20);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 0xab, 4 << 20);
  EXPECT_EQ(b.GetMemInfo(1)->free_bytes, 60u << 20);
  EXPECT_EQ(b.GetMemInfo(0)->free_bytes, 64u << 20);
  EXPECT_TRUE(b.FreeManaged(*p).ok());
  EXPECT_EQ(b.LiveResources().managed_allocations, 0);
}

TEST(HostBackendTest, CapacityGivesResourceExhausted) {
  HostBackend b({.device_count = 1, .device_capacity = 8 << 20});
  auto p = b.AllocateManaged(0, 16 << 20);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.LiveResources().managed_allocations, 0);
}

TEST(HostBackendTest, BadDeviceAndForeignFree) {
  HostBackend b({.device_count = 1});
  EXPECT_EQ(b.AllocateManaged(3, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  int x;
  EXPECT_THAT(b.FreeManaged(&x).message(), HasSubstr("not a managed allocation"));
}

TEST(HostBackendTest, PinnedMemoryAndCopies) {
  HostBackend b({.device_count = 1, .pinned_capacity = 8 << 20});
  const std::size_t n = 4 << 20;
  void* pinned = *b.AllocatePinnedHost(n);
  void* managed = *b.ReserveManaged(0, n);
  std::memset(pinned, 7, n);
  // Into unpopulated managed pages: populated on the copy's device.
  ASSERT_TRUE(b.CopyBatch({{managed, pinned, n}}, kDefaultStream).ok());
  EXPECT_EQ(static_cast<unsigned char*>(managed)[n - 1], 7);
  EXPECT_EQ(b.PageLocation(managed), 0);
  auto records = b.Records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].op, PlacementRecord::Op::kCopy);
  EXPECT_EQ(records[0].src, pinned);
  // Bad input copies nothing: one bad copy in a batch refuses the batch.
  std::memset(pinned, 9, n);
  char stack[64];
  auto bad = b.CopyBatch({{managed, pinned, n}, {managed, stack, 64}}, kDefaultStream);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("source"));
  EXPECT_EQ(static_cast<unsigned char*>(managed)[0], 7);
  EXPECT_EQ(b.CopyBatch({{pinned, managed, n + 1}}, kDefaultStream).code(),
            absl::StatusCode::kInvalidArgument);  // past the end of both
  EXPECT_EQ(b.CopyBatch({{pinned, managed, n}}, 12345).code(), absl::StatusCode::kInvalidArgument);
  // The capacity and the frees.
  EXPECT_EQ(b.AllocatePinnedHost(8 << 20).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.FreePinnedHost(managed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.LiveResources().pinned_bytes, n);
  ASSERT_TRUE(b.FreePinnedHost(pinned).ok());
  EXPECT_EQ(b.LiveResources().pinned_allocations, 0);
  ASSERT_TRUE(b.FreeManaged(managed).ok());
}

TEST(HostBackendTest, ManualCompletionHoldsEvents) {
  HostBackend b({.manual_completion = true});
  Stream s = *b.CreateStream(0);
  Event e = *b.CreateEvent(0);
  ASSERT_TRUE(b.EnqueueWork(s).ok());
  ASSERT_TRUE(b.RecordEvent(e, s).ok());
  EXPECT_FALSE(*b.QueryEvent(e));
  EXPECT_EQ(b.PendingWork(s), 1);
  ASSERT_TRUE(b.CompleteWork(s).ok());
  EXPECT_TRUE(*b.QueryEvent(e));
  // Work enqueued after the record does not delay the event.
  ASSERT_TRUE(b.RecordEvent(e, s).ok());
  ASSERT_TRUE(b.EnqueueWork(s).ok());
  EXPECT_TRUE(*b.QueryEvent(e));
  EXPECT_TRUE(b.SynchronizeStream(s).ok());
  EXPECT_EQ(b.PendingWork(s), 0);
  EXPECT_TRUE(b.DestroyEvent(e).ok());
  EXPECT_TRUE(b.DestroyStream(s).ok());
}

TEST(HostBackendTest, HostFunctionsRunInStreamOrder) {
  HostBackend b({.manual_completion = true});
  Stream s = *b.CreateStream(0), t = *b.CreateStream(0);
  std::vector<int> ran;
  ASSERT_TRUE(b.EnqueueWork(s).ok());
  ASSERT_TRUE(b.LaunchHostFunction(s, [&] { ran.push_back(1); }).ok());
  ASSERT_TRUE(b.LaunchHostFunction(s, [&] { ran.push_back(2); }).ok());
  EXPECT_TRUE(ran.empty()) << "the work before them has not completed";
  EXPECT_EQ(b.PendingWork(s), 3);  // each is a unit of work
  ASSERT_TRUE(b.CompleteWork(s).ok());
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  // Behind a wait on another stream: runs once that stream gets there.
  Event e = *b.CreateEvent(0);
  ASSERT_TRUE(b.EnqueueWork(t).ok());
  ASSERT_TRUE(b.RecordEvent(e, t).ok());
  ASSERT_TRUE(b.StreamWaitEvent(s, e).ok());
  ASSERT_TRUE(b.LaunchHostFunction(s, [&] { ran.push_back(3); }).ok());
  EXPECT_EQ(ran.size(), 2u);
  ASSERT_TRUE(b.CompleteWork(t).ok());
  EXPECT_TRUE(*b.QueryStream(s));
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(b.LaunchHostFunction(Stream{0xbad}, [&] { ran.push_back(4); }).ok());
  EXPECT_EQ(ran.size(), 3u);
  EXPECT_TRUE(b.DestroyEvent(e).ok());
  EXPECT_TRUE(b.DestroyStream(s).ok());
  EXPECT_TRUE(b.DestroyStream(t).ok());
  // Immediate mode: at once.
  HostBackend now;
  ASSERT_TRUE(now.LaunchHostFunction(kDefaultStream, [&] { ran.push_back(5); }).ok());
  EXPECT_EQ(ran.back(), 5);
}

TEST(HostBackendTest, SynchronizeEventCompletesTheWork) {
  HostBackend b({.manual_completion = true});
  Stream s = *b.CreateStream(0);
  Event e = *b.CreateEvent(0);
  ASSERT_TRUE(b.EnqueueWork(s).ok());
  ASSERT_TRUE(b.RecordEvent(e, s).ok());
  ASSERT_TRUE(b.SynchronizeEvent(e).ok());
  EXPECT_TRUE(*b.QueryEvent(e));
  b.DestroyEvent(e).IgnoreError();
  b.DestroyStream(s).IgnoreError();
}

TEST(HostBackendTest, ImmediateModeCompletesAtOnce) {
  HostBackend b;
  Stream s = *b.CreateStream(0);
  Event e = *b.CreateEvent(0);
  ASSERT_TRUE(b.EnqueueWork(s).ok());
  ASSERT_TRUE(b.RecordEvent(e, s).ok());
  EXPECT_TRUE(*b.QueryEvent(e));
  b.DestroyEvent(e).IgnoreError();
  b.DestroyStream(s).IgnoreError();
}

TEST(HostBackendTest, StreamValidation) {
  HostBackend b({.device_count = 2});
  Stream s = *b.CreateStream(1);
  EXPECT_TRUE(b.ValidateStream(1, s).ok());
  EXPECT_TRUE(b.ValidateStream(0, kDefaultStream).ok());
  EXPECT_THAT(b.ValidateStream(0, s).message(), HasSubstr("belongs to device 1"));
  EXPECT_THAT(b.ValidateStream(0, 12345).message(), HasSubstr("unknown stream"));
  EXPECT_FALSE(b.DestroyStream(kDefaultStream).ok());
  EXPECT_TRUE(b.DestroyStream(s).ok());
  EXPECT_FALSE(b.ValidateStream(1, s).ok());
}

TEST(HostBackendTest, PlacementCallsAreRecordedAndQueryable) {
  HostBackend b;
  void* p = *b.AllocateManaged(0, 1 << 20);
  ASSERT_TRUE(b.Advise(p, 1 << 20, Advice::kSetPreferredLocation, Location::Device(1)).ok());
  ASSERT_TRUE(b.Advise(p, 1 << 20, Advice::kSetReadMostly, Location::Host()).ok());
  ASSERT_TRUE(b.Prefetch(p, 4096, Location::Device(0), kDefaultStream).ok());
  Range r{p, 8192};
  ASSERT_TRUE(b.DiscardAndPrefetchBatch({&r, 1}, Location::Host(), kDefaultStream).ok());
  auto recs = b.Records();
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[0].op, PlacementRecord::Op::kAdvise);
  EXPECT_EQ(recs[2].op, PlacementRecord::Op::kPrefetch);
  EXPECT_FALSE(recs[2].batched);
  EXPECT_EQ(recs[3].op, PlacementRecord::Op::kDiscardAndPrefetch);
  EXPECT_TRUE(recs[3].batched);
  auto attr = b.GetRangeAttributes(p, 4096);
  ASSERT_TRUE(attr.ok());
  EXPECT_TRUE(attr->read_mostly);
  EXPECT_EQ(attr->preferred_location, Location::Device(1));
  EXPECT_TRUE(attr->last_prefetch_location.is_host());
  b.FreeManaged(p).IgnoreError();
}

TEST(HostBackendTest, PlacementRejectsRangesOutsideAllocations) {
  HostBackend b;
  void* p = *b.AllocateManaged(0, 4096);
  EXPECT_THAT(b.Prefetch(p, 8192, Location::Device(0), kDefaultStream).message(),
              HasSubstr("does not lie inside one managed allocation"));
  EXPECT_FALSE(b.Advise(p, 4096, Advice::kSetCoarseGrain, Location::Device(0)).ok());
  EXPECT_TRUE(b.Records().empty());
  b.FreeManaged(p).IgnoreError();
}

TEST(HostBackendTest, VmmMapsMemfdTwiceWithSharedContents) {
  HostBackend b;
  const std::size_t g = *b.VmmGranularity(0);
  PhysicalHandle h = *b.VmmCreate(0, g, HandleType::kPosixFd);
  void* a1 = *b.VmmReserve(g, 0);
  void* a2 = *b.VmmReserve(g, 0);
  ASSERT_TRUE(b.VmmMap(a1, g, h).ok());
  ASSERT_TRUE(b.VmmMap(a2, g, h).ok());
  int devs[] = {0, 1};
  ASSERT_TRUE(b.VmmSetAccess(a1, g, devs).ok());
  ASSERT_TRUE(b.VmmSetAccess(a2, g, devs).ok());
  static_cast<char*>(a1)[100] = 42;
  EXPECT_EQ(static_cast<char*>(a2)[100], 42);
  EXPECT_FALSE(b.VmmFreeAddress(a1, g).ok());  // still mapped
  ASSERT_TRUE(b.VmmUnmap(a1, g).ok());
  ASSERT_TRUE(b.VmmUnmap(a2, g).ok());
  ASSERT_TRUE(b.VmmFreeAddress(a1, g).ok());
  ASSERT_TRUE(b.VmmFreeAddress(a2, g).ok());
  ASSERT_TRUE(b.VmmRelease(h).ok());
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

TEST(HostBackendTest, VmmExportImportSharesMemory) {
  HostBackend exporter, importer;
  const std::size_t g = *exporter.VmmGranularity(0);
  PhysicalHandle h = *exporter.VmmCreate(0, g, HandleType::kPosixFd);
  auto shared = exporter.VmmExport(h, HandleType::kPosixFd);
  ASSERT_TRUE(shared.ok());
  PhysicalHandle h2 = *importer.VmmImport(*shared);
  close(shared->fd);
  void* a = *exporter.VmmReserve(g, 0);
  void* b = *importer.VmmReserve(g, 0);
  int dev0[] = {0};
  ASSERT_TRUE(exporter.VmmMap(a, g, h).ok());
  ASSERT_TRUE(exporter.VmmSetAccess(a, g, dev0).ok());
  ASSERT_TRUE(importer.VmmMap(b, g, h2).ok());
  ASSERT_TRUE(importer.VmmSetAccess(b, g, dev0).ok());
  static_cast<int*>(b)[7] = 1234;
  EXPECT_EQ(static_cast<int*>(a)[7], 1234);
  for (HostBackend* be : {&exporter, &importer}) {
    void* addr = be == &exporter ? a : b;
    ASSERT_TRUE(be->VmmUnmap(addr, g).ok());
    ASSERT_TRUE(be->VmmFreeAddress(addr, g).ok());
  }
  ASSERT_TRUE(exporter.VmmRelease(h).ok());
  ASSERT_TRUE(importer.VmmRelease(h2).ok());
}

TEST(HostBackendTest, VmmRejectsBadSizes) {
  HostBackend b;
  EXPECT_FALSE(b.VmmCreate(0, 1000, HandleType::kPosixFd).ok());
  EXPECT_FALSE(b.VmmReserve(0, 0).ok());
  EXPECT_EQ(b.VmmCreate(0, 2 << 20, HandleType::kFabric).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(HostBackendTest, MulticastOnlyWhenSupported) {
  HostBackend off;
  int devs[] = {0, 1};
  EXPECT_EQ(off.MulticastCreate(devs, 2 << 20).status().code(), absl::StatusCode::kUnimplemented);
  HostBackend on({.multicast_supported = true});
  auto mc = on.MulticastCreate(devs, 2 << 20);
  ASSERT_TRUE(mc.ok());
  EXPECT_TRUE(on.MulticastAddDevice(*mc, 1).ok());
  EXPECT_TRUE(on.MulticastRelease(*mc).ok());
  EXPECT_EQ(on.LiveResources().multicast_objects, 0);
}

TEST(HostBackendTest, CountsCalls) {
  HostBackend b;
  void* p = *b.AllocateManaged(0, 4096);
  b.FreeManaged(p).IgnoreError();
  EXPECT_EQ(b.CallCount("AllocateManaged"), 1);
  EXPECT_EQ(b.CallCount("FreeManaged"), 1);
  EXPECT_GE(b.TotalCalls(), 2);
}

// An import takes only what the exporter sends (issue 19: it took any FD
// that fstat accepted): a sealed memfd of its own making, of the size the
// exporter announced. Each impostor is refused naming what it is.
TEST(HostBackendTest, VmmImportAcceptsOnlyTheExportersSealedMemfd) {
  HostBackend exporter, importer;
  const std::size_t g = *exporter.VmmGranularity(0);
  auto refused = [&](int fd, std::size_t bytes, const char* why) {
    ShareableHandle sh;
    sh.fd = fd;
    sh.bytes = bytes;
    auto h = importer.VmmImport(sh);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(h.status().message(), ::testing::HasSubstr(why));
    close(fd);
  };
  // A regular file of the right size.
  char path[] = "/tmp/cma-import-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(g)), 0);
  refused(fd, g, "is a file, not a memfd");
  // A pipe.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  close(p[1]);
  refused(p[0], g, "is not memory");
  // Another program's memfd, and one named like ours whose size is not sealed.
  fd = memfd_create("other", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(g)), 0);
  refused(fd, g, "not a memfd made by the host backend");
  fd = memfd_create("cma-vmm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(g)), 0);
  refused(fd, g, "size is not sealed");
  // Ours in name and size, but sealed against writing: named at import (it
  // was an INTERNAL "mprotect failed" when the group set access), and the
  // refusal leaves nothing behind.
  for (const int write_seal : {F_SEAL_WRITE, 0x0010 /* F_SEAL_FUTURE_WRITE */}) {
    fd = memfd_create("cma-vmm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(g)), 0);
    ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | write_seal | F_SEAL_SEAL), 0);
    refused(fd, g, write_seal == F_SEAL_WRITE ? "sealed against writing (F_SEAL_WRITE"
                                              : "sealed against writing (F_SEAL_FUTURE_WRITE");
    EXPECT_EQ(importer.LiveResources(), HostResourceCounts{});
  }
  // A real export, announced at another size.
  PhysicalHandle h = *exporter.VmmCreate(0, g, HandleType::kPosixFd);
  auto shared = exporter.VmmExport(h, HandleType::kPosixFd);
  ASSERT_TRUE(shared.ok());
  refused(dup(shared->fd), 2 * g, "expected");
  // The real one is taken, and no holder can shrink it under the mappings.
  EXPECT_NE(ftruncate(shared->fd, 0), 0);
  auto imported = importer.VmmImport(*shared);
  ASSERT_TRUE(imported.ok()) << imported.status();
  close(shared->fd);
  ASSERT_TRUE(importer.VmmRelease(*imported).ok());
  ASSERT_TRUE(exporter.VmmRelease(h).ok());
  EXPECT_EQ(importer.LiveResources(), HostResourceCounts{});
}

}  // namespace
}  // namespace cma
