#include "kiln/core/json_writer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>

namespace kiln {
namespace {

// The writer's layout is nlohmann's dump(2) for the same document (keys written in sorted order,
// as nlohmann's std::map-backed objects order them), including empty containers and nesting.
TEST(JsonWriter, MatchesNlohmannDumpLayout) {
  JsonWriter w;
  w.BeginObject();
  w.Key("a").Int(-3);
  w.Key("b").Double(0.25);
  w.Key("c").Double(2.0);
  w.Key("d").Bool(true);
  w.Key("e").BeginArray().EndArray();
  w.Key("f").BeginObject().EndObject();
  w.Key("g").BeginArray();
  w.BeginObject().Key("x").String("y").EndObject();
  w.Int(7);
  w.EndArray();
  w.Key("h").StringArray({"p", "q"});
  w.EndObject();
  nlohmann::json j = {{"a", -3},
                      {"b", 0.25},
                      {"c", 2.0},
                      {"d", true},
                      {"e", nlohmann::json::array()},
                      {"f", nlohmann::json::object()},
                      {"g", {{{"x", "y"}}, 7}},
                      {"h", {"p", "q"}}};
  EXPECT_EQ(w.str(), j.dump(2));
}

// Quotes, backslashes and control characters are escaped, so any layer name reads back exactly;
// doubles read back to the same value; non-finite doubles are null.
TEST(JsonWriter, EscapesAndRoundTrips) {
  const std::string name = std::string("a\"b\\c\nd\te\x01") + "\xc3\xa9";
  JsonWriter w;
  w.BeginObject();
  w.Key(name).String(name);
  w.Key("third").Double(1.0 / 3.0);
  w.Key("tiny").Double(6.47e-06);
  w.Key("nan").Double(std::numeric_limits<double>::quiet_NaN());
  w.EndObject();
  nlohmann::json j = nlohmann::json::parse(w.str());
  EXPECT_EQ(j[name].get<std::string>(), name);
  EXPECT_EQ(j["third"].get<double>(), 1.0 / 3.0);
  EXPECT_EQ(j["tiny"].get<double>(), 6.47e-06);
  EXPECT_TRUE(j["nan"].is_null());
}

}  // namespace
}  // namespace kiln
