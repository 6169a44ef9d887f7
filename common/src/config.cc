// ConfigSchema and Config: TOML files and overrides are parsed with toml++ and checked
// against the declared knobs here, so every tool reports a misspelt or mistyped knob
// the same way, with where it came from and what would have been accepted.
#include "dufu/common/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include <toml++/toml.h>

#include "dufu/common/error.h"
#include "dufu/common/utf8.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/read_only_file.h"

namespace dufu {

// toml++ reports parse errors either by exception or in its result type, chosen at
// build time; the code below is written for exceptions, which Debian's build uses.
static_assert(TOML_EXCEPTIONS, "dufu's config code expects toml++ built with exceptions");

namespace {

bool is_bare_key_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

bool is_valid_knob_name(std::string_view name) {
  if (name.empty() || name.front() == '.' || name.back() == '.') return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '.') {
      if (name[i + 1] == '.') return false;
    } else if (!is_bare_key_char(name[i])) {
      return false;
    }
  }
  return true;
}

std::string_view last_segment(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

std::string_view parent_table(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? std::string_view{} : name.substr(0, dot);
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean \"optim.lr\"?)" for the closest candidate, or "" when none is
// close. The last segments are compared too, so a knob put in the wrong table
// ("model.lr", or plain "lr") still finds "optim.lr".
std::string did_you_mean(std::string_view unknown, const std::vector<std::string_view>& candidates) {
  std::size_t best_score = SIZE_MAX;
  std::string_view best;
  for (const std::string_view candidate : candidates) {
    const std::size_t score =
        std::min(edit_distance(unknown, candidate), edit_distance(last_segment(unknown), last_segment(candidate)) + 1);
    if (score < best_score) {
      best_score = score;
      best = candidate;
    }
  }
  if (best.empty() || best_score > std::max<std::size_t>(2, unknown.size() / 4)) return "";
  return str_cat(" (did you mean \"", best, "\"?)");
}

std::string format_double(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  // Shortest round-trip digits in %g style: 0.0006 rather than 6e-04, 1e-05 and
  // 1e+20 where fixed notation would be long.
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  std::string text(buffer, result.ptr);
  // TOML reads "1" as an integer; a float needs a fraction or an exponent.
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

const char* expected_description(ConfigType type) {
  switch (type) {
    case ConfigType::kInt: return "an integer";
    case ConfigType::kDouble: return "a number";
    case ConfigType::kBool: return "a boolean (true or false)";
    case ConfigType::kString: return "a string";
    case ConfigType::kStrings: return "a list of strings";
  }
  return "?";
}

// "the string \"fast\"", "the integer 4", "an array", ... for type errors.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return str_cat("the string ", quote_json_string(node.as_string()->get()));
    case toml::node_type::integer: return str_cat("the integer ", node.as_integer()->get());
    case toml::node_type::floating_point: return str_cat("the number ", format_double(node.as_floating_point()->get()));
    case toml::node_type::boolean: return node.as_boolean()->get() ? "the boolean true" : "the boolean false";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

std::string location(const std::string& source_name, const toml::source_region& region) {
  if (region.begin.line == 0) return str_cat(source_name, ": ");
  return str_cat(source_name, ":", region.begin.line, ":", region.begin.column, ": ");
}

[[noreturn]] void fail_type(const std::string& where, std::string_view name, ConfigType type, const std::string& got) {
  std::string hint;
  if (type == ConfigType::kStrings) hint = " (HINT: write a TOML array such as [\"a\", \"b\"])";
  DUFU_FAIL(where, name, ": expected ", expected_description(type), ", got ", got, hint);
}

// Checks a TOML value against a knob's type; `where` prefixes errors.
ConfigValue convert(const toml::node& node, const ConfigKnob& knob, const std::string& where) {
  switch (knob.type) {
    case ConfigType::kInt:
      // A float is refused even when integral (4.0): a count written as a float is
      // more likely a mistake than a convenience.
      if (const auto* v = node.as_integer()) return v->get();
      break;
    case ConfigType::kDouble:
      if (const auto* v = node.as_floating_point()) return v->get();
      if (const auto* v = node.as_integer()) return static_cast<double>(v->get());
      break;
    case ConfigType::kBool:
      if (const auto* v = node.as_boolean()) return v->get();
      break;
    case ConfigType::kString:
      if (const auto* v = node.as_string()) return v->get();
      break;
    case ConfigType::kStrings:
      if (const auto* array = node.as_array()) {
        std::vector<std::string> items;
        for (std::size_t i = 0; i < array->size(); ++i) {
          const toml::node& item = *array->get(i);
          const auto* text = item.as_string();
          if (text == nullptr) {
            DUFU_FAIL(where, knob.name, "[", i, "]: expected a string, got ", describe(item));
          }
          items.push_back(text->get());
        }
        return items;
      }
      break;
  }
  fail_type(where, knob.name, knob.type, describe(node));
}

std::string render_value(const ConfigValue& value) {
  struct Renderer {
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_double(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return quote_json_string(v); }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string out = "[";
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i > 0) out += ", ";
        out += quote_json_string(v[i]);
      }
      return out + "]";
    }
  };
  return std::visit(Renderer{}, value);
}

// Equality that treats NaN as equal to itself, so a NaN knob at its default is not
// reported as changed.
bool same_value(const ConfigValue& a, const ConfigValue& b) {
  if (const double* x = std::get_if<double>(&a)) {
    const double* y = std::get_if<double>(&b);
    return y != nullptr && (std::isnan(*x) ? std::isnan(*y) : *x == *y && std::signbit(*x) == std::signbit(*y));
  }
  return a == b;
}

std::string comment_lines(std::string_view text, std::string_view prefix) {
  std::string out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    out += prefix;
    out += line;
    // No trailing space on an empty comment line.
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
    start = end + 1;
  }
  return out;
}


std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace

const char* config_type_name(ConfigType type) {
  switch (type) {
    case ConfigType::kInt: return "int";
    case ConfigType::kDouble: return "double";
    case ConfigType::kBool: return "bool";
    case ConfigType::kString: return "string";
    case ConfigType::kStrings: return "list of strings";
  }
  return "?";
}

std::string config_value_to_toml(const ConfigValue& value) { return render_value(value); }

// ---------------------------------------------------------------------------- ranges

namespace {

bool is_unbounded_int(std::int64_t value) {
  return value == std::numeric_limits<std::int64_t>::min() || value == std::numeric_limits<std::int64_t>::max();
}

std::string range_number(double value) {
  std::string text = format_double(value);
  if (text.size() > 2 && text.ends_with(".0")) text.resize(text.size() - 2);
  return text;
}

}  // namespace

std::string KnobRange::describe(ConfigType type) const {
  switch (type) {
    case ConfigType::kInt:
      if (is_unbounded_int(int_min) && is_unbounded_int(int_max)) return "";
      if (is_unbounded_int(int_max)) return str_cat("at least ", int_min);
      if (is_unbounded_int(int_min)) return str_cat("at most ", int_max);
      // The widths knobs are narrowed to, as a reader knows them.
      if (int_max == std::numeric_limits<std::int32_t>::max()) return str_cat(int_min, " to 2^31-1");
      if (int_max == std::numeric_limits<std::uint32_t>::max()) return str_cat(int_min, " to 2^32-1");
      return str_cat(int_min, " to ", int_max);
    case ConfigType::kDouble:
      if (std::isinf(min) && std::isinf(max)) return "";
      if (std::isinf(max)) return str_cat("at least ", range_number(min));
      return str_cat("in [", range_number(min), ", ", range_number(max), max_open ? ")" : "]");
    case ConfigType::kString: {
      std::string words;
      for (const std::string_view choice : choices) words += str_cat(words.empty() ? "" : " | ", choice);
      return words;
    }
    case ConfigType::kBool:
    case ConfigType::kStrings: break;
  }
  return "";
}

// ---------------------------------------------------------------------------- schema

ConfigSchema& ConfigSchema::add_int(std::string name, std::int64_t default_value, std::string help) {
  add({std::move(name), ConfigType::kInt, default_value, std::move(help), {}});
  return *this;
}

ConfigSchema& ConfigSchema::add_double(std::string name, double default_value, std::string help) {
  add({std::move(name), ConfigType::kDouble, default_value, std::move(help), {}});
  return *this;
}

ConfigSchema& ConfigSchema::add_bool(std::string name, bool default_value, std::string help) {
  add({std::move(name), ConfigType::kBool, default_value, std::move(help), {}});
  return *this;
}

ConfigSchema& ConfigSchema::add_string(std::string name, std::string default_value, std::string help) {
  add({std::move(name), ConfigType::kString, std::move(default_value), std::move(help), {}});
  return *this;
}

ConfigSchema& ConfigSchema::add_strings(std::string name, std::vector<std::string> default_value, std::string help) {
  add({std::move(name), ConfigType::kStrings, std::move(default_value), std::move(help), {}});
  return *this;
}

ConfigSchema& ConfigSchema::add_table(std::span<const KnobSpec> table) {
  for (const KnobSpec& spec : table) {
    ConfigValue value;
    switch (spec.type) {
      case ConfigType::kInt: value = spec.int_default; break;
      case ConfigType::kDouble: value = spec.double_default; break;
      case ConfigType::kBool: value = spec.bool_default; break;
      case ConfigType::kString: value = std::string(spec.string_default); break;
      case ConfigType::kStrings: value = std::vector<std::string>{}; break;
    }
    add({std::string(spec.name), spec.type, std::move(value), std::string(spec.help), spec.range});
  }
  return *this;
}

void ConfigSchema::add(ConfigKnob knob) {
  DUFU_CHECK(is_valid_knob_name(knob.name), "config knob name \"", knob.name,
             "\" is not dot-separated segments of [A-Za-z0-9_-]");
  DUFU_CHECK(!index_.contains(knob.name), "config knob \"", knob.name, "\" declared twice");
  DUFU_CHECK(!tables_.contains(knob.name), "config knob \"", knob.name, "\" is also the table of other knobs");
  for (std::string_view table = parent_table(knob.name); !table.empty(); table = parent_table(table)) {
    DUFU_CHECK(!index_.contains(table), "config knob \"", knob.name, "\" is inside \"", table,
               "\", which is itself a knob");
  }
  DUFU_CHECK(knob.default_value.index() == static_cast<std::size_t>(knob.type),
             "config knob \"", knob.name, "\" has a default of the wrong type");
  for (std::string_view table = parent_table(knob.name); !table.empty(); table = parent_table(table)) {
    ++tables_[std::string(table)];
  }
  index_.emplace(knob.name, knobs_.size());
  knobs_.push_back(std::move(knob));
}

const ConfigKnob* ConfigSchema::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &knobs_[it->second];
}

bool ConfigSchema::is_table(std::string_view name) const { return tables_.find(name) != tables_.end(); }

std::string ConfigSchema::help_text() const {
  std::string out;
  for (const ConfigKnob& knob : knobs_) {
    const std::string range = knob.range.describe(knob.type);
    out += str_cat("  ", knob.name, " (", config_type_name(knob.type), ", default ", render_value(knob.default_value),
                   range.empty() ? "" : str_cat(", ", range), ")\n");
    out += comment_lines(knob.help, "      ");
  }
  return out;
}

std::string ConfigSchema::reference_markdown(std::string_view title, std::string_view preamble) const {
  // A '|' inside a cell would end it; code spans keep values literal.
  const auto cell = [](std::string_view text) {
    std::string out;
    for (const char c : text) {
      if (c == '|') out += "\\|";
      else if (c == '\n') out += ' ';
      else out += c;
    }
    return out;
  };
  std::string out = str_cat("# ", title, "\n\n", preamble, "\n");
  std::string_view current_table = "-";
  for (const ConfigKnob& knob : knobs_) {
    const std::string_view table = parent_table(knob.name);
    if (table != current_table) {
      current_table = table;
      out += str_cat("\n## ", table.empty() ? "(top level)" : str_cat("[", table, "]"), "\n\n",
                     "| knob | type | default | accepted | what it does |\n|---|---|---|---|---|\n");
    }
    const std::string range = knob.range.describe(knob.type);
    out += str_cat("| `", knob.name, "` | ", config_type_name(knob.type), " | `", cell(render_value(knob.default_value)),
                   "` | ", range.empty() ? "" : cell(range), " | ", cell(knob.help), " |\n");
  }
  return out;
}

// ---------------------------------------------------------------------------- config

namespace {

// Walks a parsed document, setting each knob it names.
class TomlLoader {
 public:
  TomlLoader(const ConfigSchema& schema, std::vector<ConfigValue>& values, const std::string& source_name)
      : schema_(schema), values_(values), source_name_(source_name) {}

  void load_table(const toml::table& table, const std::string& prefix) {
    for (auto&& [key, node] : table) {
      const std::string where = location(source_name_, key.source());
      if (key.str().find('.') != std::string_view::npos) {
        // A quoted key such as "optim.lr" = 1 is one key containing a dot, not a
        // path; accepting it would make the file mean something other than it says.
        DUFU_FAIL(where, "the quoted key \"", key.str(), "\" contains '.'; write ", key.str(),
                  " unquoted (a dotted key) or use a table");
      }
      const std::string name = prefix.empty() ? std::string(key.str()) : str_cat(prefix, ".", key.str());
      if (const toml::table* child = node.as_table(); child != nullptr && !schema_.find(name)) {
        if (!schema_.is_table(name)) fail_unknown_table(where, name);
        load_table(*child, name);
        continue;
      }
      set(name, node, where);
    }
  }

  void set(const std::string& name, const toml::node& node, const std::string& where) {
    const ConfigKnob* knob = schema_.find(name);
    if (knob == nullptr) {
      if (schema_.is_table(name)) {
        DUFU_FAIL(where, name, " is a table of knobs, so it cannot be set to ", describe(node));
      }
      fail_unknown_key(where, name);
    }
    values_[static_cast<std::size_t>(knob - schema_.knobs().data())] = convert(node, *knob, where);
  }

  [[noreturn]] void fail_unknown_key(const std::string& where, const std::string& name) const {
    std::vector<std::string_view> candidates;
    for (const ConfigKnob& knob : schema_.knobs()) candidates.push_back(knob.name);
    DUFU_FAIL(where, "unknown config key \"", name, "\"", did_you_mean(name, candidates));
  }

  [[noreturn]] void fail_unknown_table(const std::string& where, const std::string& name) const {
    std::vector<std::string_view> candidates;
    for (const ConfigKnob& knob : schema_.knobs()) {
      for (std::string_view table = parent_table(knob.name); !table.empty(); table = parent_table(table)) {
        candidates.push_back(table);
      }
    }
    DUFU_FAIL(where, "unknown config table [", name, "]", did_you_mean(name, candidates));
  }

 private:
  const ConfigSchema& schema_;
  std::vector<ConfigValue>& values_;
  const std::string& source_name_;
};

}  // namespace

Config::Config(ConfigSchema schema) : schema_(std::move(schema)) {
  values_.reserve(schema_.knobs().size());
  for (const ConfigKnob& knob : schema_.knobs()) values_.push_back(knob.default_value);
}

Config Config::load(ConfigSchema schema, const std::string& toml_path, std::span<const std::string> overrides) {
  Config config(std::move(schema));
  if (!toml_path.empty()) config.load_file(toml_path);
  config.apply_overrides(overrides);
  return config;
}

void Config::load_file(const std::string& path) {
  const std::vector<std::byte> bytes = ReadOnlyFile::open(path).read_all();
  load_toml(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

void Config::load_toml(std::string_view text, const std::string& source_name) {
  // Checked here: toml++ names the line before the one that holds a bad byte.
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    const std::string_view before = text.substr(0, bad);
    const std::size_t line_start = before.rfind('\n') == std::string_view::npos ? 0 : before.rfind('\n') + 1;
    const auto byte = static_cast<unsigned>(static_cast<unsigned char>(text[bad]));
    DUFU_FAIL(source_name, ":", std::count(before.begin(), before.end(), '\n') + 1, ":", bad - line_start + 1,
              ": TOML syntax error: not valid UTF-8 (byte 0x", std::hex, byte, std::dec, " at byte offset ", bad,
              " of the file); HINT: save the file as UTF-8");
  }
  toml::table document;
  try {
    document = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    DUFU_FAIL(location(source_name, e.source()), "TOML syntax error: ", e.description());
  }
  // Into a copy, so a document with an error changes nothing.
  std::vector<ConfigValue> values = values_;
  TomlLoader(schema_, values, source_name).load_table(document, "");
  values_ = std::move(values);
}

void Config::apply_override(std::string_view assignment) {
  const std::string where = str_cat("override \"", assignment, "\": ");
  const std::size_t equals = assignment.find('=');
  if (equals == std::string_view::npos) {
    DUFU_FAIL("malformed override \"", assignment, "\": expected name=value, e.g. optim.lr=3e-4");
  }
  const std::string name(trim(assignment.substr(0, equals)));
  const std::string_view text = trim(assignment.substr(equals + 1));
  if (name.empty()) DUFU_FAIL("malformed override \"", assignment, "\": the name before '=' is empty");
  // A value taken as a bare string would otherwise carry the bytes into to_toml (and
  // the checkpoint's state.json), which could then not be read back.
  if (!is_valid_utf8(assignment)) DUFU_FAIL("malformed override of ", name, ": not valid UTF-8");

  std::vector<ConfigValue> values = values_;
  TomlLoader loader(schema_, values, where);
  const ConfigKnob* knob = schema_.find(name);
  if (knob == nullptr && !schema_.is_table(name)) loader.fail_unknown_key(where, name);

  // Parsed as the value of a one-key document; anything else (a bare word, a path,
  // text that smuggles in a second key) is the bare string.
  std::optional<toml::table> parsed;
  try {
    toml::table document = toml::parse(str_cat("v = ", text));
    if (document.size() == 1 && document.contains("v")) parsed = std::move(document);
  } catch (const toml::parse_error&) {
  }
  const bool is_toml_string = parsed && (*parsed)["v"].is_string();
  if (!parsed || (knob != nullptr && knob->type == ConfigType::kString && !is_toml_string)) {
    loader.set(name, toml::value<std::string>(std::string(text)), where);
  } else {
    loader.set(name, *parsed->get("v"), where);
  }
  values_ = std::move(values);
}

void Config::apply_overrides(std::span<const std::string> assignments) {
  for (const std::string& assignment : assignments) apply_override(assignment);
}

const ConfigValue& Config::value_of(std::string_view name, ConfigType type) const {
  const ConfigKnob* knob = schema_.find(name);
  DUFU_CHECK(knob != nullptr, "no config knob named \"", name, "\"");
  DUFU_CHECK(knob->type == type, "config knob \"", name, "\" is declared as ", config_type_name(knob->type),
             " but read as ", config_type_name(type));
  return values_[static_cast<std::size_t>(knob - schema_.knobs().data())];
}

std::int64_t Config::get_int(std::string_view name) const {
  return std::get<std::int64_t>(value_of(name, ConfigType::kInt));
}

double Config::get_double(std::string_view name) const { return std::get<double>(value_of(name, ConfigType::kDouble)); }

bool Config::get_bool(std::string_view name) const { return std::get<bool>(value_of(name, ConfigType::kBool)); }

std::int64_t Config::get_int_in_range(std::string_view name) const {
  const std::int64_t value = get_int(name);
  const KnobRange& range = schema_.find(name)->range;
  if (value >= range.int_min && value <= range.int_max) return value;
  // A bound that is only the limit of the type a knob is narrowed to is not worth
  // naming beside the one the value broke.
  if (range.int_max >= std::numeric_limits<std::int32_t>::max()) {
    if (value < range.int_min) DUFU_FAIL(name, " must be at least ", range.int_min, ", got ", value);
    DUFU_FAIL(name, " must be at most ", range.int_max, ", got ", value);
  }
  DUFU_FAIL(name, " must be in [", range.int_min, ", ", range.int_max, "], got ", value);
}

double Config::get_double_in_range(std::string_view name) const {
  const double value = get_double(name);
  const KnobRange& range = schema_.find(name)->range;
  const bool below_max = range.max_open ? value < range.max : value <= range.max;
  if (value >= range.min && below_max) return value;
  if (range.min == 0.0 && std::isinf(range.max)) DUFU_FAIL(name, " must not be negative, got ", value);
  DUFU_FAIL(name, " must be ", range.describe(ConfigType::kDouble), ", got ", value);
}

const std::string& Config::get_choice(std::string_view name) const {
  const std::string& value = get_string(name);
  const KnobRange& range = schema_.find(name)->range;
  for (const std::string_view choice : range.choices) {
    if (value == choice) return value;
  }
  std::string words;
  for (std::size_t i = 0; i < range.choices.size(); ++i) {
    words += str_cat(i == 0 ? "" : i + 1 == range.choices.size() ? " or " : ", ", "\"", range.choices[i], "\"");
  }
  DUFU_FAIL(name, " must be ", words, ", got \"", value, "\"");
}

const std::string& Config::get_string(std::string_view name) const {
  return std::get<std::string>(value_of(name, ConfigType::kString));
}

const std::vector<std::string>& Config::get_strings(std::string_view name) const {
  return std::get<std::vector<std::string>>(value_of(name, ConfigType::kStrings));
}

const ConfigValue& Config::get(std::string_view name) const {
  const ConfigKnob* knob = schema_.find(name);
  DUFU_CHECK(knob != nullptr, "no config knob named \"", name, "\"");
  return values_[static_cast<std::size_t>(knob - schema_.knobs().data())];
}

std::string Config::to_toml() const {
  // Top-level knobs must precede every [table] header, and each table's header may
  // appear only once, so knobs are grouped by table in first-declared order.
  std::vector<std::string_view> tables;
  for (const ConfigKnob& knob : schema_.knobs()) {
    const std::string_view table = parent_table(knob.name);
    if (std::find(tables.begin(), tables.end(), table) == tables.end()) tables.push_back(table);
  }
  std::stable_partition(tables.begin(), tables.end(), [](std::string_view table) { return table.empty(); });

  std::string out;
  for (const std::string_view table : tables) {
    if (!table.empty()) out += str_cat(out.empty() ? "" : "\n", "[", table, "]\n");
    bool first = true;
    for (std::size_t i = 0; i < values_.size(); ++i) {
      const ConfigKnob& knob = schema_.knobs()[i];
      if (parent_table(knob.name) != table) continue;
      if (!first) out += '\n';
      first = false;
      out += comment_lines(knob.help, "# ");
      if (!same_value(values_[i], knob.default_value)) {
        out += str_cat("# (default: ", render_value(knob.default_value), ")\n");
      }
      out += str_cat(last_segment(knob.name), " = ", render_value(values_[i]), "\n");
    }
  }
  return out;
}

}  // namespace dufu
