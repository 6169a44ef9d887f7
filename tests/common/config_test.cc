// Tests for ConfigSchema and Config: defaults, TOML files with nested tables and
// lists, overrides beating the file, the round trip through to_toml(), and every
// input error with the message a user would see.
#include "dufu/common/config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace dufu {
namespace {

using dufu::testing::error_of;
using dufu::testing::internal_error_of;

using testing::TempDir;

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\"\ndoes not contain\n\"" << part << "\"";
}

ConfigSchema make_schema() {
  ConfigSchema schema;
  schema.add_string("run_name", "gpt2", "Name of the run, used in log lines and checkpoint names.")
      .add_int("model.n_layer", 12, "Number of transformer blocks.")
      .add_int("model.n_embd", 768, "Width of the residual stream.")
      .add_double("optim.lr", 6e-4, "Peak learning rate.")
      .add_double("optim.beta2", 0.95, "AdamW beta2.")
      .add_bool("optim.fused", true, "Use the fused AdamW kernel.")
      .add_string("data.blend", "", "Blend of datasets: weight path weight path ...")
      .add_strings("data.paths", {"a.bin", "b.bin"}, "Shard prefixes.\nOne per dataset.")
      .add_int("parallel.pipeline.stages", 1, "Pipeline-parallel stages.");
  return schema;
}


TEST(ConfigSchema, DeclaringANameTwiceIsAnInternalError) {
  ConfigSchema schema;
  schema.add_int("model.n_layer", 12, "Blocks.");
  const std::string message = internal_error_of([&] { schema.add_double("model.n_layer", 1.0, "Again."); });
  EXPECT_TRUE(Contains(message, "internal check failed"));
  EXPECT_TRUE(Contains(message, "\"model.n_layer\" declared twice"));
}

TEST(ConfigSchema, RefusesMalformedNamesAndTablesThatAreKnobs) {
  ConfigSchema schema;
  schema.add_int("model.n_layer", 12, "Blocks.");
  EXPECT_TRUE(
      Contains(internal_error_of([&] { schema.add_int("model", 1, "A table too."); }), "internal check failed"));
  EXPECT_TRUE(Contains(internal_error_of([&] { schema.add_int("model.n_layer.x", 1, "Inside a knob."); }),
              "internal check failed"));
  for (const char* bad : {"", ".a", "a.", "a..b", "a b", "a=b", "\"a\""}) {
    EXPECT_TRUE(Contains(internal_error_of([&] { schema.add_int(bad, 1, "Bad."); }), "internal check failed")) << bad;
  }
}

TEST(Config, StartsAtTheDefaults) {
  const Config config(make_schema());
  EXPECT_EQ(config.get_string("run_name"), "gpt2");
  EXPECT_EQ(config.get_int("model.n_layer"), 12);
  EXPECT_EQ(config.get_double("optim.lr"), 6e-4);
  EXPECT_TRUE(config.get_bool("optim.fused"));
  EXPECT_EQ(config.get_strings("data.paths"), (std::vector<std::string>{"a.bin", "b.bin"}));
  EXPECT_EQ(config.get_int("parallel.pipeline.stages"), 1);
}

TEST(Config, LoadsNestedTablesDottedKeysInlineTablesAndLists) {
  Config config(make_schema());
  config.load_toml(R"(run_name = "small"
optim = { lr = 3e-4, fused = false }

[model]
n_layer = 4

[data]
paths = ["x", "y", "z"]

[parallel.pipeline]
stages = 2
)",
                   "test.toml");
  EXPECT_EQ(config.get_string("run_name"), "small");
  EXPECT_EQ(config.get_int("model.n_layer"), 4);
  EXPECT_EQ(config.get_int("model.n_embd"), 768);  // not in the file: default
  EXPECT_EQ(config.get_double("optim.lr"), 3e-4);
  EXPECT_FALSE(config.get_bool("optim.fused"));
  EXPECT_EQ(config.get_strings("data.paths"), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(config.get_int("parallel.pipeline.stages"), 2);

  config.load_toml("model.n_embd = 64\nparallel.pipeline.stages = 4\ndata.paths = []\n", "dotted.toml");
  EXPECT_EQ(config.get_int("model.n_embd"), 64);
  EXPECT_EQ(config.get_int("model.n_layer"), 4);  // kept from the first document
  EXPECT_EQ(config.get_int("parallel.pipeline.stages"), 4);
  EXPECT_TRUE(config.get_strings("data.paths").empty());
}

TEST(Config, OverridesBeatTheFile) {
  TempDir dir;
  testing::write_all(dir.file("run.toml"), "[model]\nn_layer = 4\n[optim]\nlr = 1e-3\n");
  const std::vector<std::string> overrides = {
      "model.n_layer=6",          "optim.lr = 3e-4",          "data.blend=\"0.7 A 0.3 B\"",
      "run_name=foo",             "optim.fused=false",        "data.paths=[\"p\", 'q']",
      "parallel.pipeline.stages=2",
  };
  const Config config = Config::load(make_schema(), dir.file("run.toml"), overrides);
  EXPECT_EQ(config.get_int("model.n_layer"), 6);
  EXPECT_EQ(config.get_double("optim.lr"), 3e-4);
  EXPECT_EQ(config.get_string("data.blend"), "0.7 A 0.3 B");
  EXPECT_EQ(config.get_string("run_name"), "foo");
  EXPECT_FALSE(config.get_bool("optim.fused"));
  EXPECT_EQ(config.get_strings("data.paths"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(config.get_int("parallel.pipeline.stages"), 2);
  EXPECT_EQ(config.get_int("model.n_embd"), 768);
}

TEST(Config, OverrideValuesThatAreNotTomlAreBareStrings) {
  Config config(make_schema());
  config.apply_override("data.blend=foo");
  EXPECT_EQ(config.get_string("data.blend"), "foo");
  config.apply_override("data.blend=/data/web 0.5");
  EXPECT_EQ(config.get_string("data.blend"), "/data/web 0.5");
  config.apply_override("data.blend=");
  EXPECT_EQ(config.get_string("data.blend"), "");
  // A string knob takes a value verbatim unless it is a TOML string.
  config.apply_override("run_name=123");
  EXPECT_EQ(config.get_string("run_name"), "123");
  config.apply_override("run_name=true");
  EXPECT_EQ(config.get_string("run_name"), "true");
  config.apply_override("run_name='quoted'");
  EXPECT_EQ(config.get_string("run_name"), "quoted");
  // A second line does not smuggle in another key.
  config.apply_override("run_name=1\nmodel.n_layer = 2");
  EXPECT_EQ(config.get_string("run_name"), "1\nmodel.n_layer = 2");
  EXPECT_EQ(config.get_int("model.n_layer"), 12);
}

TEST(Config, AnIntegerIsAcceptedForADoubleKnob) {
  Config config(make_schema());
  config.load_toml("[optim]\nlr = 1\n", "int.toml");
  EXPECT_EQ(config.get_double("optim.lr"), 1.0);
  config.apply_override("optim.beta2=2");
  EXPECT_EQ(config.get_double("optim.beta2"), 2.0);
}

TEST(Config, AFloatIsRefusedForAnIntKnob) {
  Config config(make_schema());
  EXPECT_EQ(error_of([&] { config.load_toml("[model]\nn_layer = 4.0\n", "f.toml"); }),
            "f.toml:2:1: model.n_layer: expected an integer, got the number 4.0");
  EXPECT_EQ(error_of([&] { config.apply_override("model.n_layer=4.5"); }),
            "override \"model.n_layer=4.5\": model.n_layer: expected an integer, got the number 4.5");
  EXPECT_EQ(config.get_int("model.n_layer"), 12);
}

TEST(Config, WrongTypesSayWhatWasExpectedAndWhatCame) {
  Config config(make_schema());
  EXPECT_EQ(error_of([&] { config.load_toml("[optim]\nlr = \"fast\"\n", "t.toml"); }),
            "t.toml:2:1: optim.lr: expected a number, got the string \"fast\"");
  EXPECT_EQ(error_of([&] { config.apply_override("optim.lr=fast"); }),
            "override \"optim.lr=fast\": optim.lr: expected a number, got the string \"fast\"");
  EXPECT_TRUE(Contains(error_of([&] { config.apply_override("optim.fused=yes"); }),
              "optim.fused: expected a boolean (true or false), got the string \"yes\""));
  EXPECT_TRUE(Contains(error_of([&] { config.apply_override("optim.fused=1"); }),
              "optim.fused: expected a boolean (true or false), got the integer 1"));
  EXPECT_TRUE(Contains(error_of([&] { config.load_toml("run_name = 5\n", "t.toml"); }),
              "t.toml:1:1: run_name: expected a string, got the integer 5"));
  EXPECT_TRUE(Contains(error_of([&] { config.load_toml("[model.n_layer]\nx = 1\n", "t.toml"); }),
              "model.n_layer: expected an integer, got a table"));
  EXPECT_TRUE(Contains(error_of([&] { config.load_toml("model = 5\n", "t.toml"); }),
              "model is a table of knobs, so it cannot be set to the integer 5"));
  EXPECT_TRUE(Contains(error_of([&] { config.apply_override("model=5"); }),
              "model is a table of knobs, so it cannot be set to the integer 5"));
  EXPECT_TRUE(Contains(error_of([&] { config.load_toml("[model]\nn_layer = 1979-05-27\n", "t.toml"); }),
              "model.n_layer: expected an integer, got a date"));
}

TEST(Config, ListsAreCheckedItemByItem) {
  Config config(make_schema());
  EXPECT_EQ(error_of([&] { config.load_toml("[data]\npaths = [\"a\", 3]\n", "l.toml"); }),
            "l.toml:2:1: data.paths[1]: expected a string, got the integer 3");
  EXPECT_TRUE(Contains(error_of([&] { config.apply_override("data.paths=a.bin"); }),
              "data.paths: expected a list of strings, got the string \"a.bin\" (HINT: write a TOML "
                        "array such as [\"a\", \"b\"])"));
  EXPECT_EQ(config.get_strings("data.paths"), (std::vector<std::string>{"a.bin", "b.bin"}));
}

TEST(Config, UnknownKeysSuggestTheClosestKnob) {
  Config config(make_schema());
  EXPECT_EQ(error_of([&] { config.load_toml("[optim]\nlr = 1e-3\nlrr = 1e-3\n", "u.toml"); }),
            "u.toml:3:1: unknown config key \"optim.lrr\" (did you mean \"optim.lr\"?)");
  EXPECT_EQ(error_of([&] { config.apply_override("model.n_layers=4"); }),
            "override \"model.n_layers=4\": unknown config key \"model.n_layers\" (did you mean \"model.n_layer\"?)");
  // A knob in the wrong table, or without its table, is found by its last segment.
  EXPECT_TRUE(Contains(error_of([&] { config.apply_override("lr=4"); }),
              "unknown config key \"lr\" (did you mean \"optim.lr\"?)"));
  EXPECT_TRUE(Contains(error_of([&] { config.apply_override("model.lr=4"); }),
              "unknown config key \"model.lr\" (did you mean \"optim.lr\"?)"));
  // Nothing close: no suggestion.
  const std::string far = error_of([&] { config.apply_override("tokenizer.vocabulary_file=x"); });
  EXPECT_TRUE(Contains(far, "unknown config key \"tokenizer.vocabulary_file\""));
  EXPECT_FALSE(Contains(far, "did you mean"));
  EXPECT_EQ(error_of([&] { config.load_toml("[optm]\nlr = 1\n", "u.toml"); }),
            "u.toml:1:2: unknown config table [optm] (did you mean \"optim\"?)");
  EXPECT_TRUE(Contains(error_of([&] { config.load_toml("\"optim.lr\" = 1\n", "u.toml"); }),
              "the quoted key \"optim.lr\" contains '.'"));
  // A failed document changes nothing, not even the keys before the bad one.
  EXPECT_EQ(config.get_double("optim.lr"), 6e-4);
}

TEST(Config, MalformedOverridesAreRefused) {
  Config config(make_schema());
  EXPECT_EQ(error_of([&] { config.apply_override("optim.lr"); }),
            "malformed override \"optim.lr\": expected name=value, e.g. optim.lr=3e-4");
  EXPECT_EQ(error_of([&] { config.apply_override(" =3"); }),
            "malformed override \" =3\": the name before '=' is empty");
}

TEST(Config, TomlSyntaxErrorsGiveFileLineAndColumn) {
  TempDir dir;
  const std::string path = dir.file("bad.toml");
  testing::write_all(path, "[model]\nn_layer = 4\nn_embd = = 8\n");
  Config config(make_schema());
  const std::string message = error_of([&] { config.load_file(path); });
  EXPECT_TRUE(Contains(message, path + ":3:10: TOML syntax error: "));
  EXPECT_EQ(config.get_int("model.n_layer"), 12);
}

// Issue 26: toml++ named the line before the one holding a byte that is not UTF-8.
TEST(Config, InvalidUtf8IsReportedAtItsLineAndColumn) {
  TempDir dir;
  const std::string path = dir.file("latin1.toml");
  for (const std::string& bad : {std::string("\xe9"), std::string("\xc3\x28"), std::string("\xed\xa0\x80")}) {
    testing::write_all(path, "[model]\nn_layer = 4\n\n[data]\nblend = \"caf" + bad + "\"\n");
    Config config(make_schema());
    const std::string message = error_of([&] { config.load_file(path); });
    EXPECT_TRUE(Contains(message, path + ":5:13: TOML syntax error: not valid UTF-8 (byte 0x"));
    EXPECT_TRUE(Contains(message, "at byte offset 40 of the file); HINT: save the file as UTF-8"));
  }
  // The first byte of a file, and a line of its own after a blank one.
  testing::write_all(path, "\xff");
  EXPECT_TRUE(Contains(error_of([&] { Config(make_schema()).load_file(path); }), path + ":1:1: TOML syntax error"));
  testing::write_all(path, "run_name = \"a\"\n\n\xfe\n");
  EXPECT_TRUE(Contains(error_of([&] { Config(make_schema()).load_file(path); }), path + ":3:1: TOML syntax error"));
}

TEST(Config, AMissingFileIsNamed) {
  TempDir dir;
  Config config(make_schema());
  EXPECT_TRUE(Contains(error_of([&] { config.load_file(dir.file("missing.toml")); }), dir.file("missing.toml")));
}

TEST(Config, GettersFailLoudlyOnTheWrongTypeOrName) {
  const Config config(make_schema());
  EXPECT_TRUE(Contains(internal_error_of([&] { config.get_int("optim.lr"); }),
              "config knob \"optim.lr\" is declared as double but read as int"));
  EXPECT_TRUE(Contains(internal_error_of([&] { config.get_double("model.n_layer"); }), "internal check failed"));
  EXPECT_TRUE(Contains(internal_error_of([&] { config.get_strings("data.blend"); }), "internal check failed"));
  EXPECT_TRUE(Contains(internal_error_of([&] { config.get_bool("optim.lrr"); }), "no config knob named \"optim.lrr\""));
}

TEST(ConfigToml, RoundTripsEveryValueExactly) {
  Config config(make_schema());
  config.apply_override("run_name=\"quote \\\" backslash \\\\ tab \\t newline \\n bell \\u0007 del \\u007F é\"");
  config.apply_override("model.n_layer=-9223372036854775808");
  config.apply_override("model.n_embd=9223372036854775807");
  config.apply_override("optim.lr=0.1");
  config.apply_override("optim.beta2=-0.0");
  config.apply_override("optim.fused=false");
  config.apply_override("data.blend=\"\"");
  config.apply_override("data.paths=[\"\", \"[x]\", \"a=b # c\"]");
  const std::string text = config.to_toml();

  Config reloaded(make_schema());
  reloaded.load_toml(text, "effective.toml");
  for (const ConfigKnob& knob : config.schema().knobs()) {
    EXPECT_EQ(reloaded.get(knob.name), config.get(knob.name)) << knob.name << "\n" << text;
  }
  EXPECT_TRUE(std::signbit(reloaded.get_double("optim.beta2")));
  EXPECT_EQ(reloaded.to_toml(), text);
}

TEST(ConfigToml, RoundTripsAwkwardDoubles) {
  for (const double value : {0.1, 3e-4, 1e-300, 5e-324, 1.7976931348623157e308, 1e20, 123456789.0, 1.0 / 3.0,
                             std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    Config config(make_schema());
    config.load_toml("[optim]\nlr = " + config_value_to_toml(ConfigValue{value}) + "\n", "d.toml");
    EXPECT_EQ(config.get_double("optim.lr"), value);
    Config reloaded(make_schema());
    reloaded.load_toml(config.to_toml(), "effective.toml");
    EXPECT_EQ(reloaded.get_double("optim.lr"), value);
  }
  Config config(make_schema());
  config.apply_override("optim.lr=nan");
  Config reloaded(make_schema());
  reloaded.load_toml(config.to_toml(), "effective.toml");
  EXPECT_TRUE(std::isnan(reloaded.get_double("optim.lr")));
}

TEST(ConfigToml, ListsEveryKnobUnderItsHelp) {
  Config config(make_schema());
  config.apply_override("model.n_layer=4");
  EXPECT_EQ(config.to_toml(),
            "# Name of the run, used in log lines and checkpoint names.\n"
            "run_name = \"gpt2\"\n"
            "\n"
            "[model]\n"
            "# Number of transformer blocks.\n"
            "# (default: 12)\n"
            "n_layer = 4\n"
            "\n"
            "# Width of the residual stream.\n"
            "n_embd = 768\n"
            "\n"
            "[optim]\n"
            "# Peak learning rate.\n"
            "lr = 0.0006\n"
            "\n"
            "# AdamW beta2.\n"
            "beta2 = 0.95\n"
            "\n"
            "# Use the fused AdamW kernel.\n"
            "fused = true\n"
            "\n"
            "[data]\n"
            "# Blend of datasets: weight path weight path ...\n"
            "blend = \"\"\n"
            "\n"
            "# Shard prefixes.\n"
            "# One per dataset.\n"
            "paths = [\"a.bin\", \"b.bin\"]\n"
            "\n"
            "[parallel.pipeline]\n"
            "# Pipeline-parallel stages.\n"
            "stages = 1\n");
}

TEST(ConfigToml, HelpTextListsNameTypeDefaultAndHelp) {
  const std::string help = make_schema().help_text();
  EXPECT_TRUE(Contains(help, "  model.n_layer (int, default 12)\n      Number of transformer blocks.\n"));
  EXPECT_TRUE(Contains(help, "  optim.lr (double, default 0.0006)\n      Peak learning rate.\n"));
  EXPECT_TRUE(Contains(help, "  optim.fused (bool, default true)\n"));
  EXPECT_TRUE(Contains(help, "  data.blend (string, default \"\")\n"));
  EXPECT_TRUE(Contains(help, "  data.paths (list of strings, default [\"a.bin\", \"b.bin\"])\n"
                              "      Shard prefixes.\n      One per dataset.\n"));
  EXPECT_TRUE(Contains(help, "  parallel.pipeline.stages (int, default 1)\n"));
}

}  // namespace
}  // namespace dufu
