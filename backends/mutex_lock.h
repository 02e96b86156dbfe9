// MutexLock: MutexLock that ThreadSanitizer can see.
//
// Debian's Abseil archives are not built with -fsanitize=thread, so TSAN
// cannot observe absl::Mutex acquisitions and reports every guarded access as
// a race. In TSAN builds this lock reports each acquisition and release
// through TSAN's mutex annotation interface; elsewhere it is exactly
// absl::MutexLock. Use it for every lock in this project.
#ifndef CMA_BACKENDS_MUTEX_LOCK_H_
#define CMA_BACKENDS_MUTEX_LOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define CMA_TSAN_MUTEX 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#include <sanitizer/tsan_interface.h>
#define CMA_TSAN_MUTEX 1
#endif
#endif

namespace cma {

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
#ifdef CMA_TSAN_MUTEX
    __tsan_mutex_pre_lock(mu_, 0);
#endif
    mu_->Lock();
#ifdef CMA_TSAN_MUTEX
    __tsan_mutex_post_lock(mu_, 0, 0);
#endif
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
#ifdef CMA_TSAN_MUTEX
    __tsan_mutex_pre_unlock(mu_, 0);
#endif
    mu_->Unlock();
#ifdef CMA_TSAN_MUTEX
    __tsan_mutex_post_unlock(mu_, 0);
#endif
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace cma

#endif  // CMA_BACKENDS_MUTEX_LOCK_H_
