#include "kiln/core/hash.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(Hash, StreamingEqualsOneShot) {
  std::string text = "the quick brown fox jumps over the lazy dog";
  Hasher h;
  h.Update(std::string_view(text).substr(0, 7)).Update(std::string_view(text).substr(7));
  EXPECT_EQ(h.Digest(), HashString(text));
  EXPECT_EQ(HashString(text).Hex().size(), 32u);
  EXPECT_NE(HashString(text), HashString(text + "."));
}

TEST(Hash, FieldsAreLengthPrefixed) {
  Hasher a, b;
  a.Field("ab").Field("c");
  b.Field("a").Field("bc");
  EXPECT_NE(a.Digest(), b.Digest());
}

}  // namespace
}  // namespace kiln
