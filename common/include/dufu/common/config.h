// Typed configuration with every knob declared once (name, type, default, help), so
// that --help, the effective configuration printed at start and the copy saved with
// each checkpoint all come from the same declarations and cannot drift apart.
// Values come from defaults, then a TOML file, then "name=value" overrides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dufu {

enum class ConfigType { kInt, kDouble, kBool, kString, kStrings };

// The alternatives are in ConfigType order, so a value's index() is its type.
using ConfigValue = std::variant<std::int64_t, double, bool, std::string, std::vector<std::string>>;

// "int", "double", "bool", "string", "list of strings".
const char* config_type_name(ConfigType type);

// The values a knob accepts beyond its type, declared with it: an inclusive integer
// range, a number range (its upper end open or closed), or a fixed set of words. The
// reader of the knob enforces it (KnobSpec::int_in_range and friends) and `--help` and
// the generated reference print it, so the bound is written once.
struct KnobRange {
  std::int64_t int_min = std::numeric_limits<std::int64_t>::min();
  std::int64_t int_max = std::numeric_limits<std::int64_t>::max();
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;                       // [min, max) rather than [min, max]
  std::span<const std::string_view> choices;  // string knobs: the accepted words; empty = any

  // "1 to 4096", "at least 0", "[0, 1)", "gpt2 | llama", or "" when unbounded.
  std::string describe(ConfigType type) const;
};

// One knob as a table of knobs declares it: every part a constant, so structs can take
// their defaults from the declaration (`int n_layer = knob_int(kKnobs, "model.n_layer")`)
// and the table stays the one place a default is written.
struct KnobSpec {
  std::string_view name;
  ConfigType type = ConfigType::kInt;
  std::int64_t int_default = 0;
  double double_default = 0.0;
  bool bool_default = false;
  std::string_view string_default;
  KnobRange range;
  std::string_view help;
};

// The name, type and help every knob has; the builders below add the default and range.
constexpr KnobSpec declared_knob(std::string_view name, ConfigType type, std::string_view help) {
  KnobSpec knob;
  knob.name = name;
  knob.type = type;
  knob.help = help;
  return knob;
}
constexpr KnobSpec int_knob(std::string_view name, std::int64_t default_value, std::int64_t min, std::int64_t max,
                            std::string_view help) {
  KnobSpec knob = declared_knob(name, ConfigType::kInt, help);
  knob.int_default = default_value;
  knob.range.int_min = min;
  knob.range.int_max = max;
  return knob;
}
constexpr KnobSpec double_knob(std::string_view name, double default_value, std::string_view help,
                               double min = -std::numeric_limits<double>::infinity(),
                               double max = std::numeric_limits<double>::infinity(), bool max_open = false) {
  KnobSpec knob = declared_knob(name, ConfigType::kDouble, help);
  knob.double_default = default_value;
  knob.range.min = min;
  knob.range.max = max;
  knob.range.max_open = max_open;
  return knob;
}
constexpr KnobSpec bool_knob(std::string_view name, bool default_value, std::string_view help) {
  KnobSpec knob = declared_knob(name, ConfigType::kBool, help);
  knob.bool_default = default_value;
  return knob;
}
constexpr KnobSpec string_knob(std::string_view name, std::string_view default_value, std::string_view help,
                               std::span<const std::string_view> choices = {}) {
  KnobSpec knob = declared_knob(name, ConfigType::kString, help);
  knob.string_default = default_value;
  knob.range.choices = choices;
  return knob;
}

// The knob called `name` of a table. Called from a consteval function (as
// training_knobs.h's readers are), a misspelt name or the wrong type does not compile.
// Constexpr rather than consteval: clang 14 refuses a consteval call whose table is the
// parameter of another.
template <std::size_t N>
constexpr const KnobSpec& find_knob(const KnobSpec (&table)[N], std::string_view name) {
  for (const KnobSpec& knob : table) {
    if (knob.name == name) return knob;
  }
  throw "no knob of that name in the table";
}
template <std::size_t N>
constexpr std::int64_t knob_int(const KnobSpec (&table)[N], std::string_view name) {
  const KnobSpec& knob = find_knob(table, name);
  if (knob.type != ConfigType::kInt) throw "not an int knob";
  return knob.int_default;
}
template <std::size_t N>
constexpr double knob_double(const KnobSpec (&table)[N], std::string_view name) {
  const KnobSpec& knob = find_knob(table, name);
  if (knob.type != ConfigType::kDouble) throw "not a double knob";
  return knob.double_default;
}
template <std::size_t N>
constexpr bool knob_bool(const KnobSpec (&table)[N], std::string_view name) {
  const KnobSpec& knob = find_knob(table, name);
  if (knob.type != ConfigType::kBool) throw "not a bool knob";
  return knob.bool_default;
}
template <std::size_t N>
constexpr std::string_view knob_string(const KnobSpec (&table)[N], std::string_view name) {
  const KnobSpec& knob = find_knob(table, name);
  if (knob.type != ConfigType::kString) throw "not a string knob";
  return knob.string_default;
}

struct ConfigKnob {
  std::string name;  // dotted: "optim.lr" is key lr of TOML table [optim]
  ConfigType type;
  ConfigValue default_value;
  std::string help;
  KnobRange range;  // choices point into the declaring table, which outlives every schema
};

class ConfigSchema {
 public:
  // Declares one knob. A name is one or more dot-separated segments of
  // [A-Za-z0-9_-] (TOML bare keys). Declaring a name twice, a malformed name, or a
  // name that is also the table of another knob ("model" beside "model.n_layer") is
  // a programming error and throws through DUFU_CHECK.
  ConfigSchema& add_int(std::string name, std::int64_t default_value, std::string help);
  ConfigSchema& add_double(std::string name, double default_value, std::string help);
  ConfigSchema& add_bool(std::string name, bool default_value, std::string help);
  ConfigSchema& add_string(std::string name, std::string default_value, std::string help);
  ConfigSchema& add_strings(std::string name, std::vector<std::string> default_value, std::string help);
  // Declares each knob of a table, in order, with its range.
  ConfigSchema& add_table(std::span<const KnobSpec> table);

  // In declaration order.
  const std::vector<ConfigKnob>& knobs() const { return knobs_; }
  // nullptr when no knob has this name.
  const ConfigKnob* find(std::string_view name) const;
  // True when `name` is a table holding knobs ("model" for "model.n_layer").
  bool is_table(std::string_view name) const;
  // Every knob as "name (type, default D, range R)" and its indented help, for `--help`.
  std::string help_text() const;
  // Every knob as Markdown, a table per TOML table (knob, type, default, accepted
  // values, help) under `title`, for a generated reference page.
  std::string reference_markdown(std::string_view title, std::string_view preamble) const;

 private:
  void add(ConfigKnob knob);

  std::vector<ConfigKnob> knobs_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::size_t, std::less<>> tables_;  // table name -> knobs under it
};

// The values of every knob of a schema. All input errors throw dufu::Error saying
// where the bad value came from (file:line:column or the override text):
//   - unknown key, with "did you mean ..." for a close knob name;
//   - wrong type: 'optim.lr: expected a number, got the string "fast"'. An integer
//     is accepted for a double knob; a float is never accepted for an int knob;
//   - an override without '=';
//   - TOML syntax errors, as file:line:column;
//   - an unreadable file.
// Reading a knob with the wrong getter, or one that is not declared, is a
// programming error and throws through DUFU_CHECK.
class Config {
 public:
  // Every knob at its default.
  explicit Config(ConfigSchema schema);

  // Defaults, then the TOML file (none if `toml_path` is empty), then the overrides
  // in order: the usual way a tool builds its configuration.
  static Config load(ConfigSchema schema, const std::string& toml_path, std::span<const std::string> overrides);

  // Sets the knobs a TOML document names; nested tables map to dotted names. Knobs it
  // does not mention keep their values. `source_name` prefixes error locations.
  void load_file(const std::string& path);
  void load_toml(std::string_view text, const std::string& source_name);

  // "model.n_layer=4", "optim.lr=3e-4", "data.blend=\"0.7 A 0.3 B\"",
  // 'data.paths=["a", "b"]'. The value is parsed as a TOML value; text that is not
  // one (data.blend=foo, run.dir=/tmp/x) is taken as a bare string. For a string
  // knob any value that is not a TOML string is taken verbatim (run.name=123 is
  // "123"). Whitespace around the name and the value is ignored.
  void apply_override(std::string_view assignment);
  void apply_overrides(std::span<const std::string> assignments);

  std::int64_t get_int(std::string_view name) const;
  double get_double(std::string_view name) const;
  bool get_bool(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;
  const std::vector<std::string>& get_strings(std::string_view name) const;
  // The value checked against the knob's declared range (KnobRange); throws
  // dufu::Error naming the knob, its range and the value otherwise.
  std::int64_t get_int_in_range(std::string_view name) const;
  double get_double_in_range(std::string_view name) const;
  const std::string& get_choice(std::string_view name) const;
  const ConfigValue& get(std::string_view name) const;

  // The effective configuration as TOML: every knob, defaults included, grouped by
  // table, each under its help as a comment (and its default, when the value
  // differs). Loading it into a Config of the same schema gives the same values.
  std::string to_toml() const;
  std::string help_text() const { return schema_.help_text(); }
  const ConfigSchema& schema() const { return schema_; }

 private:
  const ConfigValue& value_of(std::string_view name, ConfigType type) const;

  ConfigSchema schema_;
  std::vector<ConfigValue> values_;  // parallel to schema_.knobs()
};

// A value as a TOML literal: 12, 0.0003, true, "text", ["a", "b"]. Doubles are
// written in the shortest form that reads back to the same bits.
std::string config_value_to_toml(const ConfigValue& value);

}  // namespace dufu
