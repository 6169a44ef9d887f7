// The ranks' comparison of their settings (rank_agreement.h): a digest from every
// rank, and only where they differ the two ranks' settings themselves, so that the
// message can name the setting.
#include "dufu/common/rank_agreement.h"

#include <algorithm>
#include <cstdint>
#include <span>

#include "dufu/common/digest.h"
#include "dufu/common/error.h"

namespace dufu {
namespace {

// Values longer than this are shown around their first difference.
constexpr std::size_t kShownValue = 96;

std::string compared_text(const std::vector<AgreedSetting>& settings) {
  std::string text;
  for (const AgreedSetting& setting : settings) text += str_cat(setting.name, '\0', setting.value, '\0');
  return text;
}

std::string sent_text(const std::vector<AgreedSetting>& settings) {
  std::string text;
  for (const AgreedSetting& setting : settings) {
    text += str_cat(setting.name, '\0', setting.value, '\0', setting.note, '\0');
  }
  return text;
}

std::vector<AgreedSetting> parse_sent(const std::string& text) {
  std::vector<AgreedSetting> settings;
  std::size_t at = 0;
  auto next = [&] {
    const std::size_t end = text.find('\0', at);
    std::string field = text.substr(at, end - at);
    at = end + 1;
    return field;
  };
  while (at < text.size()) {
    AgreedSetting setting;
    setting.name = next();
    setting.value = next();
    setting.note = next();
    settings.push_back(std::move(setting));
  }
  return settings;
}

std::string broadcast_text(Communicator& world, std::string text, int root) {
  auto size = static_cast<std::int64_t>(text.size());
  world.broadcast(std::span<std::int64_t>(&size, 1), root);
  text.resize(static_cast<std::size_t>(size));
  if (size > 0) {
    world.broadcast(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()), text.size()), root);
  }
  return text;
}

// `value` quoted, cut to the part around `difference` when it is long.
std::string shown(const std::string& value, std::size_t difference, const std::string& note) {
  std::string text;
  if (value.size() <= kShownValue) {
    text = value;
  } else {
    const std::size_t begin = difference > kShownValue / 4 ? difference - kShownValue / 4 : 0;
    text = str_cat(begin > 0 ? "..." : "", value.substr(begin, kShownValue),
                   begin + kShownValue < value.size() ? "..." : "");
  }
  return str_cat("'", text, "'", note.empty() ? "" : str_cat(" (", note, ")"));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string list;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    list += str_cat(i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ", ranks[i]);
  }
  return list;
}

}  // namespace

std::optional<std::string> rank_disagreement(Communicator& world, const std::vector<AgreedSetting>& settings) {
  if (world.size() == 1) return std::nullopt;
  const std::string digest = sha256_hex(compared_text(settings));
  std::vector<std::uint8_t> digests(digest.size() * static_cast<std::size_t>(world.size()));
  world.all_gather(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(digest.data()), digest.size()),
                   digests);
  const auto digest_of = [&](int rank) {
    return std::string(reinterpret_cast<const char*>(digests.data()) + static_cast<std::size_t>(rank) * digest.size(),
                       digest.size());
  };
  std::vector<int> differing;
  for (int rank = 1; rank < world.size(); ++rank) {
    if (digest_of(rank) != digest_of(0)) differing.push_back(rank);
  }
  if (differing.empty()) return std::nullopt;

  const int other = differing.front();
  const std::string mine = sent_text(settings);
  const std::vector<AgreedSetting> first = parse_sent(broadcast_text(world, world.rank() == 0 ? mine : "", 0));
  const std::vector<AgreedSetting> second = parse_sent(broadcast_text(world, world.rank() == other ? mine : "", other));
  std::string what;
  for (std::size_t i = 0; i < std::max(first.size(), second.size()); ++i) {
    if (i >= first.size() || i >= second.size() || first[i].name != second[i].name) {
      const auto named = [](const std::vector<AgreedSetting>& list, std::size_t at) {
        return at < list.size() ? "the setting '" + list[at].name + "'" : std::string("fewer settings");
      };
      what = str_cat("rank ", other, " has ", named(second, i), " where rank 0 has ", named(first, i));
      break;
    }
    if (first[i].value != second[i].value) {
      const std::string& zero = first[i].value;
      const auto difference = static_cast<std::size_t>(
          std::mismatch(zero.begin(), zero.end(), second[i].value.begin(), second[i].value.end()).first - zero.begin());
      what = str_cat(first[i].name, " is ", shown(second[i].value, difference, second[i].note), " on rank ", other,
                     " but ", shown(first[i].value, difference, first[i].note), " on rank 0");
      break;
    }
  }
  DUFU_CHECK(!what.empty(), "ranks 0 and ", other, " sent different digests of the same settings");
  return str_cat("the ranks were not started alike: ", what, " (rank", differing.size() > 1 ? "s " : " ",
                 rank_list(differing), " of ", world.size(), " differ", differing.size() > 1 ? "" : "s",
                 " from rank 0); HINT: give every rank the same options and the same files");
}

}  // namespace dufu
