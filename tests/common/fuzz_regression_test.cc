// What the fuzz targets (fuzz/, scripts/fuzz.sh) found in libdufu_common, each as the
// smallest input that shows it, so that the normal suites keep it fixed.
#include <gtest/gtest.h>

#include <string>

#include "dufu/common/config.h"
#include "dufu/common/error.h"
#include "support/expect_error.h"

namespace dufu {
namespace {

ConfigSchema make_schema() {
  ConfigSchema schema;
  schema.add_string("data.blend", "", "Blend of datasets.")
      .add_strings("data.paths", {}, "Shard prefixes.")
      .add_double("optim.lr", 6e-4, "Peak learning rate.");
  return schema;
}

// training_config_fuzzer: the override data.blend="0.\377\377~\375 7 A ..." is not a
// TOML value (TOML text is UTF-8), so it was taken as a bare string with its bytes;
// to_toml then printed a configuration that does not load, which is also what each
// checkpoint saves in state.json (which simdjson then refuses as invalid UTF-8).
TEST(FuzzRegression, OverrideThatIsNotUtf8IsRefused) {
  Config config(make_schema());
  for (const std::string override_text :
       {"data.blend=\"0.\xff\xff~\xfd\x06\\\xd6S7 A 0.3 B\"", "data.blend=caf\xc3", "data.blend=\xc0\xaf",
        "data.blend=\xed\xa0\x80", "data.blend=\xf4\x90\x80\x80", "data.paths=[\"a\xff\"]"}) {
    testing::expect_error([&] { config.apply_override(override_text); }, {"not valid UTF-8"});
  }
  EXPECT_EQ(config.get_string("data.blend"), "");
  EXPECT_TRUE(config.get_strings("data.paths").empty());
}

TEST(FuzzRegression, OverrideInUtf8PrintsAsTomlThatLoadsBack) {
  Config config(make_schema());
  const std::string blend = "0.7 caf\xc3\xa9 0.3 \xe6\x97\xa5\xe6\x9c\xac/\xf0\x9f\x98\x80";
  config.apply_override("data.blend=" + blend);
  config.apply_override("data.paths=[\"\xc3\xa9\", \"\\u00e9\"]");
  Config again(make_schema());
  again.load_toml(config.to_toml(), "to_toml");
  EXPECT_EQ(again.get_string("data.blend"), blend);
  EXPECT_EQ(again.get_strings("data.paths"), (std::vector<std::string>{"\xc3\xa9", "\xc3\xa9"}));
}

}  // namespace
}  // namespace dufu
