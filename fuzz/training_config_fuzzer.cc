// The training configuration (train --config FILE and name=value overrides): TOML
// through toml++, typed knobs, then training_options' ranges and cross-checks. Inputs
// whose size is odd are read as one override per line instead of a TOML file. A
// configuration that loads must print (to_toml, what each checkpoint saves) as TOML
// that loads back to the same values.
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "dufu/common/config.h"
#include "dufu/trainer/run/training_config.h"
#include "fuzz_input.h"

namespace {

// Equal values, with doubles compared by their bits (a NaN is itself).
bool same_value(const dufu::ConfigValue& a, const dufu::ConfigValue& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a)) {
    return std::bit_cast<std::uint64_t>(*x) == std::bit_cast<std::uint64_t>(std::get<double>(b));
  }
  return a == b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dufu::Config config(dufu::trainer::training_config_schema());
  const bool loaded = refused_cleanly_or_parsed([&] {
    if (size % 2 == 0) {
      config.load_toml(text, "fuzz.toml");
      return;
    }
    for (std::string_view rest = text; !rest.empty();) {
      const std::size_t newline = rest.find('\n');
      config.apply_override(rest.substr(0, newline));
      rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
    }
  });
  if (!loaded) return 0;
  refused_cleanly_or_parsed([&] { (void)dufu::trainer::training_options(config); });

  dufu::Config again(dufu::trainer::training_config_schema());
  again.load_toml(config.to_toml(), "to_toml");
  for (const dufu::ConfigKnob& knob : config.schema().knobs()) {
    fuzz_require(same_value(config.get(knob.name), again.get(knob.name)),
                 "to_toml does not load back to the same value");
  }
  return 0;
}
