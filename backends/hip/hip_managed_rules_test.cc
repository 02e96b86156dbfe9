// ROCm's managed-memory rules (hip_managed_rules.h) on the host: the target
// name's xnack feature decides, HSA_XNACK explains, and the attribute is
// the evidence only where the target names no such feature.
#include "backends/hip/hip_managed_rules.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

HipManagedInputs In(const char* arch, bool concurrent, const char* hsa_xnack = nullptr) {
  HipManagedInputs in;
  in.arch_name = arch;
  in.concurrent_managed_access = concurrent;
  in.pageable_memory_access = concurrent;
  if (hsa_xnack != nullptr) {
    in.has_hsa_xnack = true;
    in.hsa_xnack = hsa_xnack;
  }
  return in;
}

TEST(HipManagedRulesTest, XnackFeatureIsReadFromTheTargetName) {
  EXPECT_EQ(XnackFromArchName("gfx90a:sramecc+:xnack+"), Xnack::kOn);
  EXPECT_EQ(XnackFromArchName("gfx942:sramecc+:xnack-"), Xnack::kOff);
  EXPECT_EQ(XnackFromArchName("gfx90a:xnack-:sramecc+"), Xnack::kOff);
  EXPECT_EQ(XnackFromArchName("gfx1100"), Xnack::kAbsent);
  EXPECT_EQ(XnackFromArchName(""), Xnack::kAbsent);
  // Only a feature after the processor counts, and only exactly spelled.
  EXPECT_EQ(XnackFromArchName("xnack+"), Xnack::kAbsent);
  EXPECT_EQ(XnackFromArchName("gfx90a:xnack"), Xnack::kAbsent);
  EXPECT_EQ(XnackFromArchName("gfx90a:xnack+x"), Xnack::kAbsent);
}

TEST(HipManagedRulesTest, XnackOnMigratesOnFault) {
  const HipManagedMode m = DecideHipManagedMode(In("gfx90a:sramecc+:xnack+", true, "1"));
  EXPECT_EQ(m.xnack, Xnack::kOn);
  EXPECT_TRUE(m.page_fault_migration);
  EXPECT_THAT(m.note, HasSubstr("XNACK on"));
  EXPECT_THAT(m.note, HasSubstr("gfx90a:sramecc+:xnack+"));
}

TEST(HipManagedRulesTest, XnackOffDoesNotMigrateEvenIfTheAttributeSaysConcurrent) {
  // MI200/MI300 without HSA_XNACK=1: the target name says xnack-.
  const HipManagedMode m = DecideHipManagedMode(In("gfx942:sramecc+:xnack-", true));
  EXPECT_EQ(m.xnack, Xnack::kOff);
  EXPECT_FALSE(m.page_fault_migration);
  EXPECT_THAT(m.note, HasSubstr("HSA_XNACK unset"));
  EXPECT_THAT(m.note, HasSubstr("Run with HSA_XNACK=1"));
}

TEST(HipManagedRulesTest, HsaXnackSetButNotInEffectIsExplained) {
  // A virtualised MI210 reports xnack- although HSA_XNACK=1 is set.
  const HipManagedMode m = DecideHipManagedMode(In("gfx90a:sramecc+:xnack-", false, "1"));
  EXPECT_FALSE(m.page_fault_migration);
  EXPECT_THAT(m.note, HasSubstr("HSA_XNACK=1 is set but did not take effect"));
  EXPECT_THAT(m.note, Not(HasSubstr("Run with HSA_XNACK=1")));
}

TEST(HipManagedRulesTest, HsaXnackAloneNeverTurnsMigrationOn) {
  // A GPU without the feature (RDNA) ignores HSA_XNACK: what was wrong in
  // the backend's first rule, which trusted the variable.
  const HipManagedMode m = DecideHipManagedMode(In("gfx1100", false, "1"));
  EXPECT_EQ(m.xnack, Xnack::kAbsent);
  EXPECT_FALSE(m.page_fault_migration);
  EXPECT_THAT(m.note, HasSubstr("HSA_XNACK has no effect here"));
}

TEST(HipManagedRulesTest, WithoutTheFeatureTheAttributeDecides) {
  // An APU or a non-ROCm runtime (hip_on_cuda reports "sm_90").
  const HipManagedMode yes = DecideHipManagedMode(In("sm_90", true));
  EXPECT_EQ(yes.xnack, Xnack::kAbsent);
  EXPECT_TRUE(yes.page_fault_migration);
  EXPECT_THAT(yes.note, HasSubstr("concurrent managed access"));
  EXPECT_FALSE(DecideHipManagedMode(In("gfx1030", false)).page_fault_migration);
}

TEST(HipManagedRulesTest, NamesAreStable) {
  EXPECT_STREQ(XnackName(Xnack::kOn), "on");
  EXPECT_STREQ(XnackName(Xnack::kOff), "off");
  EXPECT_STREQ(XnackName(Xnack::kAbsent), "absent");
}

}  // namespace
}  // namespace cma
