#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "common/json_writer.hpp"

namespace pod_init {
namespace {

TEST(JsonWriter, NestedContainersCompact) {
  JsonWriter json(0);
  json.begin_object()
      .key("a")
      .value(1)
      .key("b")
      .begin_array()
      .value("x")
      .null()
      .value(true)
      .end_array()
      .key("c")
      .begin_object()
      .end_object()
      .key("d")
      .value(2.5)
      .end_object();
  EXPECT_EQ(json.str(), R"({"a":1,"b":["x",null,true],"c":{},"d":2.5})");
}

TEST(JsonWriter, EscapesControlCharactersAndQuotes) {
  EXPECT_EQ(json_escape("a\"b\\c\n\x01"), "a\\\"b\\\\c\\n\\u0001");
  JsonWriter json(0);
  json.begin_array().value(std::nan("")).value(uint64_t{1} << 40).end_array();
  EXPECT_EQ(json.str(), "[null,1099511627776]");
}

TEST(JsonWriter, IndentsNestedItems) {
  JsonWriter json(2);
  json.begin_object().key("k").begin_array().value(1).end_array().end_object();
  EXPECT_EQ(json.str(), "{\n  \"k\": [\n    1\n  ]\n}");
}

}  // namespace
}  // namespace pod_init
