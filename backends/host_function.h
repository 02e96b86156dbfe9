// The callback half of Backend::LaunchHostFunction for runtimes whose host
// functions take a C function and a pointer (cudaLaunchHostFunc,
// hipLaunchHostFunc): the function travels to the runtime's thread on the
// heap, and RunHostFunction runs it once and frees it.
//
// Ownership: NewHostFunction's pointer belongs to the runtime once the launch
// succeeds; if the launch fails, the caller frees it with DropHostFunction.
// Thread safety: none needed (each pointer is used by one thread at a time).
#ifndef CMA_BACKENDS_HOST_FUNCTION_H_
#define CMA_BACKENDS_HOST_FUNCTION_H_

#include <utility>

#include "absl/functional/any_invocable.h"

namespace cma {

using HostFunction = absl::AnyInvocable<void() &&>;

inline void* NewHostFunction(HostFunction fn) { return new HostFunction(std::move(fn)); }

inline void DropHostFunction(void* data) { delete static_cast<HostFunction*>(data); }

// The C callback: runs the function, then frees it.
inline void RunHostFunction(void* data) {
  auto* fn = static_cast<HostFunction*>(data);
  std::move (*fn)();
  delete fn;
}

}  // namespace cma

#endif  // CMA_BACKENDS_HOST_FUNCTION_H_
