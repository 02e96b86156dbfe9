// Shared by the C ABI's tests: JSON results, and a fixture with the host
// backend initialised.
#ifndef CMA_INTEGRATIONS_C_CAPI_TEST_UTIL_H_
#define CMA_INTEGRATIONS_C_CAPI_TEST_UTIL_H_

#include "gtest/gtest.h"
#include "integrations/c/cma_c.h"
#include "nlohmann/json.hpp"

namespace cma_test {

// Parses and releases a string from cma_*_json.
inline nlohmann::json Json(char* s) {
  EXPECT_NE(s, nullptr) << cma_last_error();
  nlohmann::json j = nlohmann::json::parse(s ? s : "null");
  cma_string_free(s);
  return j;
}

class HostCApiTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cma_init("", "host"), 0) << cma_last_error(); }
  void TearDown() override { cma_shutdown(); }
};

}  // namespace cma_test

#endif  // CMA_INTEGRATIONS_C_CAPI_TEST_UTIL_H_
