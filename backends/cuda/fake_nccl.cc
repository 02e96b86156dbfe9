// The stand-in NCCL of fake_nccl.h, built as a shared library that the test
// names in CMA_NCCL_LIBRARY. Signatures as nccl.h (2.28) declares them, with
// results as ints and communicators and windows as opaque pointers.
#include <cstddef>

#include "backends/cuda/fake_nccl.h"

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidUsage = 5;
constexpr int kInProgress = 7;

FakeNcclComm* AsFake(void* comm) { return static_cast<FakeNcclComm*>(comm); }

// Any call but ncclCommGetAsyncError on a busy communicator.
bool Busy(FakeNcclComm* c) {
  if (c->busy_polls <= 0) return false;
  ++c->used_while_busy;
  return true;
}

int Deferred(FakeNcclComm* c, int at_once) {
  if (c->call_polls <= 0) return at_once;
  c->busy_polls = c->call_polls;
  return kInProgress;
}

}  // namespace

extern "C" {

int ncclGetVersion(int* version) {
  *version = 22809;
  return kSuccess;
}

const char* ncclGetErrorString(int result) {
  return result == 2 ? "unhandled system error" : "fake NCCL error";
}

const char* ncclGetLastError(void* comm) {
  return comm == nullptr ? "" : AsFake(comm)->last_error;
}

int ncclCommCount(void* comm, int* count) {
  if (Busy(AsFake(comm))) return kInvalidUsage;
  *count = AsFake(comm)->size;
  return kSuccess;
}

int ncclCommUserRank(void* comm, int* rank) {
  if (Busy(AsFake(comm))) return kInvalidUsage;
  *rank = AsFake(comm)->rank;
  return kSuccess;
}

int ncclCommCuDevice(void* comm, int* device) {
  if (Busy(AsFake(comm))) return kInvalidUsage;
  *device = AsFake(comm)->device;
  return kSuccess;
}

int ncclCommGetAsyncError(void* comm, int* state) {
  FakeNcclComm* c = AsFake(comm);
  ++c->polls;
  if (c->busy_polls > 0) {
    --c->busy_polls;
    *state = kInProgress;
  } else {
    *state = c->async_error;
  }
  return kSuccess;
}

int ncclCommWindowRegister(void* comm, void* /*buffer*/, std::size_t /*size*/, void** window,
                           int /*flags*/) {
  FakeNcclComm* c = AsFake(comm);
  if (Busy(c)) return kInvalidUsage;
  ++c->registrations;
  *window = c->window;
  return Deferred(c, c->register_result);
}

int ncclCommWindowDeregister(void* comm, void* /*window*/) {
  FakeNcclComm* c = AsFake(comm);
  if (Busy(c)) return kInvalidUsage;
  ++c->deregistrations;
  return Deferred(c, kSuccess);
}

}  // extern "C"
