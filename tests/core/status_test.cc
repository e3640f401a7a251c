#include "kiln/core/status.h"

#include <gtest/gtest.h>

#include <set>

namespace kiln {
namespace {

Status FailingStep() {
  return MakeError(ErrorCode::kUnsupportedOps, "2 ops: {}, {}", "Foo", "Bar");
}

Status Caller() {
  KILN_RETURN_IF_ERROR_CTX(FailingStep(), "while importing '{}'", "model.onnx");
  return OkStatus();
}

StatusOr<int> Half(int x) {
  if (x % 2) return MakeError(ErrorCode::kInvalidArgument, "{} is odd", x);
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  KILN_ASSIGN_OR_RETURN(int h, Half(x));
  KILN_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, OkIsEmpty) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(sizeof(Status), sizeof(void*));
}

TEST(Status, ErrorCarriesCodeMessageContextAndRemedy) {
  Status s = Caller();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kUnsupportedOps);
  EXPECT_EQ(s.Id(), "KILN-E2004");
  EXPECT_EQ(s.message(), "2 ops: Foo, Bar");
  ASSERT_EQ(s.context().size(), 1u);
  EXPECT_EQ(s.context()[0], "while importing 'model.onnx'");
  EXPECT_EQ(s.ToString(), "KILN-E2004 [onnx] 2 ops: Foo, Bar (while importing 'model.onnx')");
  EXPECT_NE(s.Explain().find("remedy: the message lists every unsupported node"),
            std::string::npos);
}

TEST(Status, CopyIsDeep) {
  Status a = MakeError(ErrorCode::kIoError, "x");
  Status b = a;
  b.AddContext("more");
  EXPECT_TRUE(a.context().empty());
  EXPECT_EQ(b.context().size(), 1u);
}

TEST(StatusOr, PropagatesValuesAndErrors) {
  EXPECT_EQ(*Quarter(12), 3);
  StatusOr<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "3 is odd");
}

TEST(ErrorCatalog, CodesAreUniqueAndComplete) {
  std::set<int> numbers;
  for (const ErrorInfo& e : ErrorCatalog()) {
    EXPECT_TRUE(numbers.insert(e.number).second) << "duplicate code " << e.number;
    EXPECT_FALSE(e.summary.empty()) << e.name;
    EXPECT_FALSE(e.remedy.empty()) << e.name;
    EXPECT_EQ(FindError(e.Id()), &e);
    EXPECT_GE(e.number, 1000);
    EXPECT_LT(e.number, 10000);
  }
  EXPECT_EQ(FindError("E2004")->code, ErrorCode::kUnsupportedOps);
  EXPECT_EQ(FindError("KILN-E0"), nullptr);
  EXPECT_EQ(FindError("garbage"), nullptr);
}

}  // namespace
}  // namespace kiln
