// The training step the learned-step tests (learn_step_test,
// learn_step_review_test) repeat on the host backend: parameters made
// before the first step, then per step a forward pass layer by layer (each
// activation read by the next layer), a backward pass in reverse that frees
// each activation after its last use, an optional last use (an optimizer's
// update), and the step's end (MarkIteration). Every use is reported with
// NoteUses, as cma.torch's hooks do.
#ifndef CMA_TESTS_LEARN_STEP_FIXTURE_H_
#define CMA_TESTS_LEARN_STEP_FIXTURE_H_

#include <cstring>
#include <vector>

#include "tests/test_util.h"

namespace cma {

class LearnStepFixture : public AllocatorTest {
 protected:
  static constexpr std::size_t kMiB = std::size_t{1} << 20;

  // A 160 MiB device part (the rest of a 1 GiB budget on the host) and
  // `layers` parameters of `param` bytes, each filled with 'a' + its index.
  void MakeLayers(int layers, std::size_t param) {
    Make({.device_count = 1, .device_capacity = 256 * kMiB},
         "oversubscribe:1,learn_step:1,managed_budget:1G,device_headroom:96M");
    s_ = *backend_->CreateStream(0);
    param_ = param;
    for (int i = 0; i < layers; ++i) {
      params_.push_back(Alloc(param, 0, s_));
      ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
      std::memset(params_.back(), 'a' + i, param);
    }
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());  // the first step begins
  }
  void TearDown() override {
    for (void* p : params_) EXPECT_TRUE(alloc_->Free(p).ok());
    AllocatorTest::TearDown();
  }
  void Use(std::vector<void*> ptrs) { ASSERT_TRUE(alloc_->NoteUses(0, ptrs, s_).ok()); }

  struct StepShape {
    int layers = -1;         // -1: every parameter's layer
    std::size_t act = 0;     // bytes of each activation
    std::vector<void*> last_use;  // reported as one use after backward
    bool routed = false;     // activations made in a host-tier context
  };
  // One step; returns how many activations the allocator placed on the host.
  int RunStep(const StepShape& shape) {
    const int layers = shape.layers < 0 ? static_cast<int>(params_.size()) : shape.layers;
    int on_host = 0;
    std::vector<void*> acts;
    for (int i = 0; i < layers; ++i) {
      if (shape.routed) {
        EXPECT_TRUE(alloc_->SetHostRouting(0, true).ok());
      }
      void* a = Alloc(shape.act, 0, s_);
      if (shape.routed) {
        EXPECT_TRUE(alloc_->SetHostRouting(0, false).ok());
      }
      on_host += *alloc_->PlacedOnHost(a);
      Use(i == 0 ? std::vector<void*>{params_[i], a}
                 : std::vector<void*>{params_[i], a, acts.back()});
      acts.push_back(a);
    }
    for (int i = layers - 1; i >= 0; --i) {
      Use({params_[i], acts[i]});
      EXPECT_TRUE(alloc_->Free(acts[i]).ok());
    }
    if (!shape.last_use.empty()) Use(shape.last_use);
    EXPECT_TRUE(alloc_->MarkIteration(0).ok());
    ExpectInvariants();
    return on_host;
  }
  // Each parameter still holds what MakeLayers wrote.
  void ExpectParamsIntact() {
    ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const char* p = static_cast<const char*>(params_[i]);
      EXPECT_EQ(p[0], static_cast<char>('a' + i));
      EXPECT_EQ(p[param_ / 2], static_cast<char>('a' + i));
      EXPECT_EQ(p[param_ - 1], static_cast<char>('a' + i));
    }
  }

  Stream s_ = 0;
  std::size_t param_ = 0;
  std::vector<void*> params_;
};

}  // namespace cma

#endif  // CMA_TESTS_LEARN_STEP_FIXTURE_H_
