// Picks a backend by name: "host", "cuda", "hip", or "best" (CUDA when a
// CUDA device is visible, else HIP when an AMD device is, else host).
//
// Errors: kNotFound for a backend not compiled into this build, or
// kUnavailable when it is compiled in but no device is visible.
#ifndef CMA_BACKENDS_REGISTRY_H_
#define CMA_BACKENDS_REGISTRY_H_

#include <memory>
#include <vector>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/backend.h"

namespace cma {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name);
// Names of the backends compiled into this build.
std::vector<std::string> CompiledBackends();

}  // namespace cma

#endif  // CMA_BACKENDS_REGISTRY_H_
