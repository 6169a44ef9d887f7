// Typed configuration with every knob declared once (name, type, default, help), so
// that --help, the effective configuration printed at start and the copy saved with
// each checkpoint all come from the same declarations and cannot drift apart.
// Values come from defaults, then a TOML file, then "name=value" overrides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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

struct ConfigKnob {
  std::string name;  // dotted: "optim.lr" is key lr of TOML table [optim]
  ConfigType type;
  ConfigValue default_value;
  std::string help;
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

  // In declaration order.
  const std::vector<ConfigKnob>& knobs() const { return knobs_; }
  // nullptr when no knob has this name.
  const ConfigKnob* find(std::string_view name) const;
  // True when `name` is a table holding knobs ("model" for "model.n_layer").
  bool is_table(std::string_view name) const;
  // Every knob as "name (type, default D)" and its indented help, for `--help`.
  std::string help_text() const;

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
