// bench/link_limit's inputs: the step file's parser (every bad line is a
// clear error naming the file and line), link_duplex_bench's JSON, and the
// link-bound times.
#include <string>

#include "bench/link_model.h"
#include "bench/step_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

TEST(StepFileTest, ReadsEveryEventAndTheMetadata) {
  auto f = ParseStepFile(
      "# recorded by a test\n"
      "cma_step v1\n"
      "# in_memory_s=0.263\n"
      "live,7,4096\n"
      "alloc,8,1024\n"
      "\n"
      "use,7:r,8:w\n"
      "use,8\n"
      "use,8:rw,7:r\n"
      "free,8\n",
      "t.csv");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->meta.at("in_memory_s"), "0.263");
  const Step& s = f->step;
  ASSERT_EQ(s.allocations().size(), 2u);
  EXPECT_TRUE(s.allocations()[0].carried);
  EXPECT_EQ(s.allocations()[0].bytes, 4096u);
  EXPECT_EQ(s.allocations()[1].bytes, 1024u);
  ASSERT_EQ(s.events().size(), 5u);  // alloc, 3 uses, free
  ASSERT_EQ(s.accesses().size(), 5u);
  EXPECT_FALSE(s.accesses()[0].writes);  // 7:r
  EXPECT_TRUE(s.accesses()[1].writes);   // 8:w
  EXPECT_TRUE(s.accesses()[2].writes);   // 8 (rw by default)
  EXPECT_EQ(s.allocations()[1].free_event, 4);
}

TEST(StepFileTest, BadInputIsAClearError) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"", "t.csv: empty step (no header)"},
      {"alloc,1,10\n", "t.csv:1: expected the header 'cma_step v1': 'alloc,1,10'"},
      {"cma_step v2\n", "t.csv:1: expected the header"},
      {"cma_step v1\nalloc,1\n", "t.csv:2: expected 'alloc,<id>,<bytes>': 'alloc,1'"},
      {"cma_step v1\nlive,1,-5\n", "t.csv:2: expected 'live,<id>,<bytes>'"},
      {"cma_step v1\nlive,x,5\n", "t.csv:2: expected 'live,<id>,<bytes>'"},
      {"cma_step v1\nalloc,1,10,3\n", "t.csv:2: expected 'alloc,<id>,<bytes>'"},
      {"cma_step v1\nalloc,1,99999999999999999999999\n", "t.csv:2: expected 'alloc"},
      {"cma_step v1\nalloc,1,10\nuse,1:x\n", "t.csv:3: bad access '1:x'"},
      {"cma_step v1\nalloc,1,10\nuse,1,\n", "t.csv:3: bad access ''"},
      {"cma_step v1\nuse\n", "t.csv:2: expected 'use,<id>[:r|:w|:rw],...'"},
      {"cma_step v1\nfree\n", "t.csv:2: expected 'free,<id>'"},
      {"cma_step v1\nmalloc,1,10\n", "t.csv:2: unknown event"},
      {"cma_step v1\nuse,3\n", "t.csv:2: id 3 is used before it is declared"},
      {"cma_step v1\nalloc,1,10\nlive,1,10\n", "t.csv:3: id 1 is declared twice"},
      {"cma_step v1\nalloc,1,10\nfree,1\nuse,1\n", "t.csv:4: id 1 is used after its free"},
      {"cma_step v1\nalloc,1,10\nfree,1\nfree,1\n", "t.csv:4: id 1 is freed twice"},
  };
  for (const Case& c : cases) {
    auto f = ParseStepFile(c.text, "t.csv");
    ASSERT_FALSE(f.ok()) << c.text;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(f.status().message(), HasSubstr(c.says)) << c.text;
  }
}

TEST(StepFileTest, AMissingFileIsAnError) {
  auto f = ReadStepFile("/nonexistent/step.csv.gz");
  EXPECT_THAT(f.status().message(), HasSubstr("cannot open step file /nonexistent/step.csv.gz"));
}

TEST(LinkModelTest, ParsesTheBenchSummary) {
  auto r = ParseLinkJson(R"({"gpu": "H200", "summary": {
      "copy_engine": {"h2d_alone_gbps": 55, "d2h_alone_gbps": 50,
                      "duplex_h2d_gbps": 26, "duplex_d2h_gbps": 26},
      "sm_mapped": {"h2d_alone_gbps": 52, "d2h_alone_gbps": 48,
                    "duplex_h2d_gbps": 41.8, "duplex_d2h_gbps": 41.8}}})",
                         "l.json");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[1].method, "sm_mapped");
  EXPECT_EQ((*r)[1].h2d, 41.8);
  EXPECT_EQ((*r)[0].h2d_alone, 55);
  EXPECT_THAT(ParseLinkJson("{", "l.json").status().message(), HasSubstr("l.json: not JSON"));
  EXPECT_THAT(ParseLinkJson("{}", "l.json").status().message(), HasSubstr("no \"summary\""));
  EXPECT_THAT(ParseLinkJson(R"({"summary": {"ce": {"h2d_alone_gbps": 1}}})", "l.json")
                  .status()
                  .message(),
              HasSubstr("method \"ce\" has no positive number \"duplex_h2d_gbps\""));
  EXPECT_THAT(ParseLinkJson(R"({"summary": {"ce": {"h2d_alone_gbps": 1, "d2h_alone_gbps": 1,
                 "duplex_h2d_gbps": 0, "duplex_d2h_gbps": 1}}})",
                            "l.json")
                  .status()
                  .message(),
              HasSubstr("\"duplex_h2d_gbps\""));
}

TEST(LinkModelTest, TimesAtTheSimultaneousAndAloneRates) {
  LinkRates r;
  r.h2d = 40;
  r.d2h = 20;
  EXPECT_DOUBLE_EQ(LinkBoundSeconds(r, 40e9, 10e9), 1.0);
  EXPECT_DOUBLE_EQ(LinkBoundSeconds(r, 20e9, 30e9), 1.5);
  r.duplex_total = 50;
  EXPECT_DOUBLE_EQ(LinkBoundSeconds(r, 40e9, 20e9), 1.2);
  r.duplex_total = 0;
  // Alone rates unknown: the same.
  EXPECT_DOUBLE_EQ(MixedLinkBoundSeconds(r, 40e9, 10e9), 1.0);
  // H2D alone at 50: 0.5 s together moves 20 GB H2D and the 10 GB D2H,
  // then 20 GB alone takes 0.4 s.
  r.h2d_alone = 50;
  r.d2h_alone = 25;
  EXPECT_DOUBLE_EQ(MixedLinkBoundSeconds(r, 40e9, 10e9), 0.9);
  EXPECT_DOUBLE_EQ(MixedLinkBoundSeconds(r, 50e9, 0), 1.0);
  EXPECT_LE(MixedLinkBoundSeconds(r, 33e9, 17e9), LinkBoundSeconds(r, 33e9, 17e9));
}

}  // namespace
}  // namespace cma
