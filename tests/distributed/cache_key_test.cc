// Cache keys: every component changes the digest; the order libraries are listed in does not.
#include "kiln/distributed/cache_key.h"

#include <gtest/gtest.h>

#include <set>

namespace kiln::distributed {
namespace {

CacheKey Key(std::string model, std::string precision, std::string arch, std::string cuda) {
  return KeyBuilder()
      .ModelBytes(std::as_bytes(std::span(model.data(), model.size())))
      .Config("precision", precision)
      .Target("cuda", arch)
      .LibraryVersion("kiln", "0.1.0")
      .LibraryVersion("cuda", cuda)
      .Build();
}

TEST(CacheKeyTest, EveryComponentChangesTheKey) {
  std::set<std::string> keys = {
      Key("model-a", "fp16", "sm_90", "13.0").Hex(), Key("model-b", "fp16", "sm_90", "13.0").Hex(),
      Key("model-a", "fp32", "sm_90", "13.0").Hex(), Key("model-a", "fp16", "sm_80", "13.0").Hex(),
      Key("model-a", "fp16", "sm_90", "12.4").Hex()};
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_EQ(Key("model-a", "fp16", "sm_90", "13.0").Hex(),
            Key("model-a", "fp16", "sm_90", "13.0").Hex());
  EXPECT_EQ(Key("m", "fp16", "sm_90", "13.0").Hex().size(), 32u);
}

TEST(CacheKeyTest, StreamingModelBytesMatchesOneShot) {
  std::string model = "0123456789abcdef";
  CacheKey whole =
      KeyBuilder().ModelBytes(std::as_bytes(std::span(model.data(), model.size()))).Build();
  KeyBuilder parts;
  parts.ModelBytes(std::as_bytes(std::span(model.data(), 5)));
  parts.ModelBytes(std::as_bytes(std::span(model.data() + 5, model.size() - 5)));
  EXPECT_EQ(whole.Hex(), parts.Build().Hex());
}

TEST(CacheKeyTest, ConfigFieldsAreDelimited) {
  EXPECT_NE(KeyBuilder().Config("ab", "c").Build().Hex(),
            KeyBuilder().Config("a", "bc").Build().Hex());
}

TEST(CacheKeyTest, LibraryOrderDoesNotMatter) {
  CacheKey a = KeyBuilder().LibraryVersion("cuda", "13.0").LibraryVersion("nccl", "2.28").Build();
  CacheKey b = KeyBuilder().LibraryVersion("nccl", "2.28").LibraryVersion("cuda", "13.0").Build();
  EXPECT_EQ(a.Hex(), b.Hex());
  EXPECT_NE(a.Describe().find(a.Hex()), std::string::npos);
}

}  // namespace
}  // namespace kiln::distributed
