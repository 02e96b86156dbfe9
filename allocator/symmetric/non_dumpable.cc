// SymmetricOptions::non_dumpable: the process stays non-dumpable while any
// heap that asked for it holds symmetric memory. The setting is
// process-wide, so heaps share one count, and the setting found before the
// first holder comes back after the last.
#include <sys/prctl.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

struct Dumpable {
  absl::Mutex mu;
  int holders ABSL_GUARDED_BY(mu) = 0;
  int before ABSL_GUARDED_BY(mu) = 0;  // PR_GET_DUMPABLE before the first holder
};

Dumpable& State() {
  static Dumpable* d = new Dumpable;  // never destroyed: heaps may outlive statics
  return *d;
}

}  // namespace

absl::Status SymmetricHeap::HoldNonDumpable() {
  // The group's choice, not only this process's: a member's mappings of
  // the others' buffers expose their memory as much as its own.
  if (!group_non_dumpable_ || non_dumpable_held_) return absl::OkStatus();
  Dumpable& d = State();
  MutexLock l(&d.mu);
  if (d.holders == 0) {
    const int before = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
    if (before < 0 || (before != 0 && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)) {
      return absl::InternalError(absl::StrCat(
          "symmetric heap: cannot make the process non-dumpable (options.non_dumpable): prctl: ",
          std::strerror(errno)));
    }
    d.before = before;
  }
  ++d.holders;
  non_dumpable_held_ = true;
  return absl::OkStatus();
}

void SymmetricHeap::ReleaseNonDumpableIfEmpty() {
  if (!non_dumpable_held_ || !live_.empty() || !cache_.empty() || !leftovers_.empty()) return;
  Dumpable& d = State();
  MutexLock l(&d.mu);
  non_dumpable_held_ = false;
  if (--d.holders == 0 && d.before != 0) (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

}  // namespace cma
