// Tests for JsonWriter and quote_json_string: commas and nesting, string escaping,
// integer extremes, doubles that read back exactly through strtod, NaN and infinities
// as null, and misuse caught by DUFU_CHECK.
#include "dufu/common/json_writer.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "support/expect_error.h"

namespace dufu {
namespace {

TEST(JsonWriter, EmptyContainers) {
  EXPECT_EQ(JsonWriter().begin_object().end_object().str(), "{}");
  EXPECT_EQ(JsonWriter().begin_array().end_array().str(), "[]");
  EXPECT_EQ(JsonWriter().str(), "");
}

TEST(JsonWriter, NestingAndCommas) {
  JsonWriter json;
  json.begin_object();
  json.key("step").value(12).key("loss").value(3.5);
  json.key("list").begin_array().value(1).value(2).begin_object().key("b").null().end_object().begin_array()
      .end_array().value("x").end_array();
  json.key("flags").begin_object().key("on").value(true).key("off").value(false).end_object();
  json.key("empty").begin_object().end_object();
  json.key("last").value(-1);
  json.end_object();
  EXPECT_EQ(json.str(),
            "{\"step\":12,\"loss\":3.5,\"list\":[1,2,{\"b\":null},[],\"x\"],\"flags\":{\"on\":true,\"off\":false},"
            "\"empty\":{},\"last\":-1}");

  JsonWriter nested;
  nested.begin_array().begin_array().begin_array().value(0).end_array().value(1).end_array().value(2).end_array();
  EXPECT_EQ(nested.str(), "[[[0],1],2]");
}

TEST(JsonWriter, TopLevelScalars) {
  EXPECT_EQ(JsonWriter().value(7).str(), "7");
  EXPECT_EQ(JsonWriter().value("text").str(), "\"text\"");  // a string, not the bool overload
  EXPECT_EQ(JsonWriter().null().str(), "null");
  EXPECT_EQ(JsonWriter().value(false).str(), "false");
}

TEST(JsonWriter, IntegerExtremes) {
  JsonWriter json;
  json.begin_array()
      .value(std::numeric_limits<std::int64_t>::min())
      .value(std::numeric_limits<std::int64_t>::max())
      .value(std::numeric_limits<std::uint64_t>::max())
      .value(0u)
      .value(-42)
      .value(std::numeric_limits<unsigned>::max())
      .end_array();
  EXPECT_EQ(json.str(), "[-9223372036854775808,9223372036854775807,18446744073709551615,0,-42,4294967295]");
}

TEST(JsonWriter, EscapesStringsAndKeys) {
  EXPECT_EQ(quote_json_string(""), "\"\"");
  EXPECT_EQ(quote_json_string("plain text"), "\"plain text\"");
  EXPECT_EQ(quote_json_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(quote_json_string("\n\t\r\b\f"), "\"\\n\\t\\r\\b\\f\"");
  EXPECT_EQ(quote_json_string(std::string("\x00\x01\x1f\x7f", 4)), "\"\\u0000\\u0001\\u001F\\u007F\"");
  EXPECT_EQ(quote_json_string("caf\xc3\xa9 \xe2\x82\xac /"), "\"caf\xc3\xa9 \xe2\x82\xac /\"");  // UTF-8 and '/' as is

  JsonWriter json;
  json.begin_object().key("k\"ey\n").value(std::string("v\\al\x02")).end_object();
  EXPECT_EQ(json.str(), "{\"k\\\"ey\\n\":\"v\\\\al\\u0002\"}");
}

// Every finite double must come back bit for bit from the text written.
void expect_round_trip(double number) {
  const std::string text = JsonWriter().value(number).str();
  char* end = nullptr;
  const double back = std::strtod(text.c_str(), &end);
  EXPECT_EQ(end, text.c_str() + text.size()) << text;
  EXPECT_EQ(std::bit_cast<std::uint64_t>(back), std::bit_cast<std::uint64_t>(number))
      << text << " reads back as " << back;
}

TEST(JsonWriter, DoublesRoundTripThroughStrtod) {
  for (const double number : {0.0, -0.0, 0.1, 1.0 / 3.0, 3.5, -2.25, 1e-300, 1e300, 123456789012345678.0,
                              std::numeric_limits<double>::min(), std::numeric_limits<double>::denorm_min(),
                              std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest(),
                              9007199254740993.0, static_cast<double>(0.1f)}) {
    expect_round_trip(number);
  }
  std::mt19937_64 engine(5);
  for (int i = 0; i < 10000; ++i) {
    const double number = std::bit_cast<double>(engine());
    if (std::isfinite(number)) expect_round_trip(number);
  }
  // Shortest digits, not printf's %.17g.
  EXPECT_EQ(JsonWriter().value(0.1).str(), "0.1");
  EXPECT_EQ(JsonWriter().value(2.0).str(), "2");
}

TEST(JsonWriter, NonFiniteDoublesAreNull) {
  JsonWriter json;
  json.begin_object()
      .key("nan")
      .value(std::numeric_limits<double>::quiet_NaN())
      .key("inf")
      .value(std::numeric_limits<double>::infinity())
      .key("-inf")
      .value(-std::numeric_limits<double>::infinity())
      .key("next")
      .value(1.5)
      .end_object();
  EXPECT_EQ(json.str(), "{\"nan\":null,\"inf\":null,\"-inf\":null,\"next\":1.5}");
}

TEST(JsonWriter, MisuseThrows) {
  const std::vector<std::pair<const char*, std::function<void()>>> misuses = {
      {"value without key", [] { JsonWriter().begin_object().value(1); }},
      {"container without key", [] { JsonWriter().begin_object().begin_array(); }},
      {"key in array", [] { JsonWriter().begin_array().key("k"); }},
      {"key at top level", [] { JsonWriter().key("k"); }},
      {"two keys", [] { JsonWriter().begin_object().key("a").key("b"); }},
      {"end_object after a key", [] { JsonWriter().begin_object().key("a").end_object(); }},
      {"end_object of an array", [] { JsonWriter().begin_array().end_object(); }},
      {"end_array of an object", [] { JsonWriter().begin_object().end_array(); }},
      {"end_object without begin", [] { JsonWriter().end_object(); }},
      {"end_array without begin", [] { JsonWriter().end_array(); }},
      {"second top-level value", [] { JsonWriter().value(1).value(2); }},
      {"value after a closed object", [] { JsonWriter().begin_object().end_object().begin_array(); }},
  };
  for (const auto& [what, misuse] : misuses) {
    SCOPED_TRACE(what);
    dufu::testing::expect_internal_error(misuse, {"internal check failed", "JsonWriter"});
  }
}

}  // namespace
}  // namespace dufu
