#include "backends/cuda/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cma {
namespace {

// The few NCCL types these calls need, as nccl.h (2.27, 2.28) declares them:
// results are a C enum (an int), communicators and windows opaque pointers.
using NcclResult = int;
constexpr NcclResult kNcclSuccess = 0;
constexpr NcclResult kNcclInProgress = 7;
constexpr NcclResult kGaveUp = -1;  // not NCCL's: Finish stopped waiting
constexpr int kNcclWinCollSymmetric = 0x01;  // NCCL_WIN_COLL_SYMMETRIC
constexpr int kFirstWindowVersion = 22700;   // NCCL_VERSION(2, 27, 0)

struct NcclApi {
  NcclResult (*ncclGetVersion)(int*) = nullptr;
  const char* (*ncclGetErrorString)(NcclResult) = nullptr;
  const char* (*ncclGetLastError)(void*) = nullptr;  // optional
  NcclResult (*ncclCommCount)(void*, int*) = nullptr;
  NcclResult (*ncclCommUserRank)(void*, int*) = nullptr;
  NcclResult (*ncclCommCuDevice)(void*, int*) = nullptr;
  NcclResult (*ncclCommGetAsyncError)(void*, NcclResult*) = nullptr;
  NcclResult (*ncclCommWindowRegister)(void*, void*, std::size_t, void**, int) = nullptr;
  NcclResult (*ncclCommWindowDeregister)(void*, void*) = nullptr;
  std::string library;
  int version = 0;
};

absl::StatusOr<NcclApi> Load() {
  NcclApi api;
  // The NCCL already loaded (by the framework whose communicator this is)
  // comes first: a communicator is only valid in the library that made it.
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  api.library = "libnccl.so.2 (already loaded)";
  const char* chosen = std::getenv("CMA_NCCL_LIBRARY");
  if (lib == nullptr && chosen != nullptr && chosen[0] != '\0') {
    lib = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("CMA_NCCL_LIBRARY=", chosen, " cannot be loaded: ", dlerror()));
    }
    api.library = chosen;
  }
  if (lib == nullptr) {
    lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          "NCCL is not available for communicator windows (", dlerror(),
          "); load it first (import torch.distributed) or set CMA_NCCL_LIBRARY"));
    }
    api.library = "libnccl.so.2";
  }
  std::string missing;
#define CMA_NCCL_LOAD(f)                                              \
  api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f));          \
  if (api.f == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", #f);
  CMA_NCCL_LOAD(ncclGetVersion)
  CMA_NCCL_LOAD(ncclGetErrorString)
  CMA_NCCL_LOAD(ncclCommCount)
  CMA_NCCL_LOAD(ncclCommUserRank)
  CMA_NCCL_LOAD(ncclCommCuDevice)
  CMA_NCCL_LOAD(ncclCommGetAsyncError)
  CMA_NCCL_LOAD(ncclCommWindowRegister)
  CMA_NCCL_LOAD(ncclCommWindowDeregister)
#undef CMA_NCCL_LOAD
  api.ncclGetLastError = reinterpret_cast<decltype(api.ncclGetLastError)>(
      dlsym(lib, "ncclGetLastError"));
  if (api.ncclGetVersion != nullptr) api.ncclGetVersion(&api.version);
  if (!missing.empty() || api.version < kFirstWindowVersion) {
    return absl::UnimplementedError(absl::StrCat(
        api.library, " (NCCL ", api.version, ") has no communicator windows",
        missing.empty() ? "" : absl::StrCat(": it lacks ", missing), "; they need NCCL 2.27+"));
  }
  return api;  // the library stays loaded for the life of the process
}

absl::StatusOr<const NcclApi*> Api() {
  static const absl::StatusOr<NcclApi>* table = new absl::StatusOr<NcclApi>(Load());
  if (!table->ok()) return table->status();
  return &**table;
}

// How long a non-blocking communicator's call may stay in progress:
// CMA_NCCL_TIMEOUT_S seconds, 600 (torch's NCCL watchdog default) if unset.
absl::StatusOr<absl::Duration> WaitLimit() {
  const char* env = std::getenv("CMA_NCCL_TIMEOUT_S");
  if (env == nullptr || env[0] == '\0') return absl::Seconds(600);
  double seconds = 0;
  if (!absl::SimpleAtod(env, &seconds) || !(seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CMA_NCCL_TIMEOUT_S=", env, ": want a number of seconds above 0"));
  }
  return absl::Seconds(seconds);
}

absl::Status NcclStatus(const NcclApi& api, void* comm, NcclResult r, absl::string_view call) {
  if (r == kNcclSuccess) return absl::OkStatus();
  if (r == kGaveUp) {
    return absl::DeadlineExceededError(absl::StrCat(
        call, " was still in progress on a non-blocking communicator after CMA_NCCL_TIMEOUT_S "
        "(a member that never joined?); the communicator's state is unknown: abort it "
        "(ncclCommAbort)"));
  }
  std::string detail = api.ncclGetErrorString(r);
  const char* last = api.ncclGetLastError != nullptr ? api.ncclGetLastError(comm) : nullptr;
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&detail, ": ", last);
  const std::string message = absl::StrCat(call, " failed (NCCL ", api.version, "): ", detail);
  // ncclInvalidArgument (4) and ncclInvalidUsage (5) are the caller's.
  if (r == 4 || r == 5) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

// A non-blocking communicator returns ncclInProgress and finishes later;
// kGaveUp once `limit` has passed. Polls before it sleeps: a blocking
// communicator's call costs one ncclCommGetAsyncError.
NcclResult Finish(const NcclApi& api, void* comm, NcclResult r, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (r == kNcclInProgress) {
    NcclResult state = kNcclSuccess;
    const NcclResult q = api.ncclCommGetAsyncError(comm, &state);
    r = q != kNcclSuccess ? q : state;
    if (r != kNcclInProgress) break;
    if (absl::Now() > deadline) return kGaveUp;
    absl::SleepFor(absl::Microseconds(50));
  }
  return r;
}

// A non-blocking communicator takes no call until its previous operation
// (its initialisation, say) has finished: NCCL 2.28.9 refuses one ("Attempt
// to use communicator before the previous operation returned ncclSuccess",
// bench/results/h200x2_nccl_nonblocking/). So every call here first waits
// for the communicator. (Even then, NCCL 2.28.9 registers no symmetric
// window on a non-blocking communicator: measured there.)
absl::Status WaitReady(const NcclApi& api, void* comm, absl::Duration limit, const char* next) {
  return NcclStatus(api, comm, Finish(api, comm, kNcclInProgress, limit),
                    absl::StrCat("the communicator's previous operation (before ", next, ")"));
}

void* AsComm(CommHandle comm) { return reinterpret_cast<void*>(comm); }

}  // namespace

absl::StatusOr<CommFacts> NcclCommFacts(CommHandle comm) {
  absl::StatusOr<const NcclApi*> api = Api();
  if (!api.ok()) return api.status();
  if (comm == 0) return absl::InvalidArgumentError("NCCL communicator: null");
  CommFacts f;
  const NcclApi& n = **api;
  absl::StatusOr<absl::Duration> limit = WaitLimit();
  if (!limit.ok()) return limit.status();
  if (absl::Status ready = WaitReady(n, AsComm(comm), *limit, "ncclCommCount"); !ready.ok()) {
    return ready;
  }
  absl::Status s = NcclStatus(n, AsComm(comm), n.ncclCommCount(AsComm(comm), &f.size),
                              "ncclCommCount");
  s.Update(NcclStatus(n, AsComm(comm), n.ncclCommUserRank(AsComm(comm), &f.rank),
                      "ncclCommUserRank"));
  s.Update(NcclStatus(n, AsComm(comm), n.ncclCommCuDevice(AsComm(comm), &f.device),
                      "ncclCommCuDevice"));
  if (!s.ok()) return s;
  return f;
}

absl::StatusOr<CommWindow> NcclRegisterWindow(CommHandle comm, void* ptr, std::size_t bytes) {
  absl::StatusOr<const NcclApi*> api = Api();
  if (!api.ok()) return api.status();
  const NcclApi& n = **api;
  absl::StatusOr<absl::Duration> limit = WaitLimit();
  if (!limit.ok()) return limit.status();
  if (absl::Status ready = WaitReady(n, AsComm(comm), *limit, "ncclCommWindowRegister");
      !ready.ok()) {
    return ready;
  }
  void* window = nullptr;
  const NcclResult r = Finish(
      n, AsComm(comm),
      n.ncclCommWindowRegister(AsComm(comm), ptr, bytes, &window, kNcclWinCollSymmetric),
      *limit);
  absl::Status s = NcclStatus(n, AsComm(comm), r, "ncclCommWindowRegister");
  if (!s.ok()) return s;
  return reinterpret_cast<CommWindow>(window);
}

absl::Status NcclDeregisterWindow(CommHandle comm, CommWindow window) {
  absl::StatusOr<const NcclApi*> api = Api();
  if (!api.ok()) return api.status();
  const NcclApi& n = **api;
  absl::StatusOr<absl::Duration> limit = WaitLimit();
  if (!limit.ok()) return limit.status();
  if (absl::Status ready = WaitReady(n, AsComm(comm), *limit, "ncclCommWindowDeregister");
      !ready.ok()) {
    return ready;
  }
  return NcclStatus(n, AsComm(comm),
                    Finish(n, AsComm(comm),
                           n.ncclCommWindowDeregister(AsComm(comm),
                                                      reinterpret_cast<void*>(window)),
                           *limit),
                    "ncclCommWindowDeregister");
}

}  // namespace cma
