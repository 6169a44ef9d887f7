// A tiktoken rank file: one "base64(token bytes) rank" per line. The rank is the id
// and the merge priority; every two tokens whose concatenation is a token merge into
// it (tiktoken's _byte_pair_merge), so the merge table holds every such split.
#include "tiktoken_loader.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "byte_level_bpe.h"
#include "dufu/common/error.h"
#include "pretokenizer_patterns.h"

namespace dufu::dataprep::tokenizers {
namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view text, std::string* bytes) {
  bytes->clear();
  std::uint32_t buffer = 0;
  int bits = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] != '='; ++i) {
    const int value = base64_value(text[i]);
    if (value < 0) return false;
    buffer = (buffer << 6) | static_cast<std::uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes->push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  for (; i < text.size(); ++i) {
    if (text[i] != '=') return false;
  }
  return !bytes->empty();
}

struct KnownEncoding {
  const char* name;
  const char* pattern;
  std::int32_t num_ranks;  // the rank file's size, which the special tokens follow
  std::vector<std::pair<std::string, std::int32_t>> specials;
};

const std::vector<KnownEncoding>& known_encodings() {
  static const std::vector<KnownEncoding> encodings = {
      {"gpt2", kGpt2Pattern, 50256, {{"<|endoftext|>", 50256}}},
      {"cl100k", kCl100kPattern, 100256,
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"o200k", kO200kPattern, 199998, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
  };
  return encodings;
}

std::string pattern_from_file_name(const std::string& path) {
  std::string stem = std::filesystem::path(path).filename().string();
  if (const auto dot = stem.find('.'); dot != std::string::npos) stem.resize(dot);
  if (stem == "gpt2" || stem == "r50k_base" || stem == "p50k_base") return "gpt2";
  if (stem == "cl100k_base") return "cl100k";
  if (stem == "o200k_base") return "o200k";
  DUFU_FAIL("'", path, "' is a tiktoken rank file and needs `tokenizer_pattern` gpt2|cl100k|o200k|REGEX ",
            "(the pattern is inferred only for the names gpt2, r50k_base, p50k_base, cl100k_base and o200k_base)");
}

// The whole file at once: o200k's 3.6 MB are 200k lines, and a getline, a substr
// and a stoll per line cost as much as building the tables.
std::string read_rank_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DUFU_FAIL("cannot open tokenizer model '", path, "'");
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) DUFU_FAIL("cannot read '", path, "'");
  return std::move(contents).str();
}

}  // namespace

std::unique_ptr<TokenizerModel> load_tiktoken(const TokenizerSpec& spec) {
  const std::string file = read_rank_file(spec.model);
  ByteLevelBpeConfig config;
  std::string bytes;
  struct RankLine {
    std::size_t line_number;
    std::int64_t rank;
    std::string bytes;
  };
  std::vector<RankLine> ranks;
  std::int64_t largest_rank = -1;
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < file.size();) {
    std::size_t end = file.find('\n', start);
    if (end == std::string::npos) end = file.size();
    std::string_view line(file.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const auto space = line.find(' ');
    std::int64_t rank = -1;
    if (space != std::string_view::npos) {
      const char* digits = line.data() + space + 1;
      const char* digits_end = line.data() + line.size();
      const auto [stop, error] = std::from_chars(digits, digits_end, rank);
      if (error != std::errc() || stop != digits_end || digits == digits_end) rank = -1;
    }
    if (space == std::string_view::npos || rank < 0 || rank >= (1LL << 30) ||
        !base64_decode(line.substr(0, space), &bytes)) {
      DUFU_FAIL(spec.model, ":", line_number, ": not a tiktoken rank line (base64 bytes, a space, a rank)");
    }
    ranks.push_back({line_number, rank, bytes});
    largest_rank = std::max(largest_rank, rank);
  }
  // The ranks index tables: their size follows the largest rank, not the file.
  check_id_range(spec.model, largest_rank, ranks.size());
  config.token_bytes.resize(static_cast<std::size_t>(largest_rank + 1));
  config.defined.resize(config.token_bytes.size(), false);
  for (auto& [number, rank, token] : ranks) {
    const auto id = static_cast<std::size_t>(rank);
    if (config.defined[id]) DUFU_FAIL(spec.model, ":", number, ": rank ", rank, " appears twice");
    config.token_bytes[id] = std::move(token);
    config.defined[id] = true;
  }
  const auto num_ranks = static_cast<std::int32_t>(config.token_bytes.size());

  TokenLookup rank_of;
  std::int32_t earlier = -1;
  const std::int32_t duplicate = rank_of.build(&config.token_bytes, config.defined, &earlier);
  if (duplicate >= 0) {
    DUFU_FAIL("'", spec.model, "' has the same token bytes at two ranks (", earlier, " and ", duplicate, ")");
  }
  for (int byte = 0; byte < 256; ++byte) {
    const std::int32_t found = rank_of.find(std::string(1, static_cast<char>(byte)));
    if (found < 0) {
      DUFU_FAIL("'", spec.model, "' has no token for the byte ", byte,
                "; byte-level BPE needs one for each of the 256 bytes");
    }
    config.model.set_byte_token(static_cast<unsigned char>(byte), found);
  }
  // The merges first, then a table of their exact size: reserving for every split of
  // every token (o200k: 1.2 million, of which 446k are merges) doubles the table that
  // the page faults zero and every look-up spreads over.
  struct Merge {
    std::int32_t left;
    std::int32_t right;
    std::int32_t id;
  };
  std::vector<Merge> merges;
  merges.reserve(config.token_bytes.size() * 3);
  // Each look-up is a cache miss in an 8 MB table: the hashes of a token's halves
  // first, their slots prefetched, so that its misses overlap.
  std::vector<std::uint64_t> left_hashes;
  std::vector<std::uint64_t> right_hashes;
  for (std::size_t id = 0; id < config.token_bytes.size(); ++id) {
    if (!config.defined[id]) continue;
    const std::string_view token = config.token_bytes[id];
    left_hashes.assign(token.size(), 0);
    right_hashes.assign(token.size(), 0);
    for (std::size_t cut = 1; cut < token.size(); ++cut) {
      left_hashes[cut] = hash_bytes(token.substr(0, cut));
      right_hashes[cut] = hash_bytes(token.substr(cut));
      rank_of.prefetch(left_hashes[cut]);
      rank_of.prefetch(right_hashes[cut]);
    }
    for (std::size_t cut = 1; cut < token.size(); ++cut) {
      const std::int32_t left = rank_of.find(token.substr(0, cut), left_hashes[cut]);
      if (left < 0) continue;
      const std::int32_t right = rank_of.find(token.substr(cut), right_hashes[cut]);
      if (right < 0) continue;
      merges.push_back({left, right, static_cast<std::int32_t>(id)});
    }
  }
  config.model.reserve_merges(merges.size());
  for (const Merge& merge : merges) {
    config.model.add_merge(merge.left, merge.right, static_cast<std::uint32_t>(merge.id), merge.id);
  }

  // encode_ordinary maps a piece that is a rank's bytes to that rank without merging.
  config.ignore_merges = true;
  config.whole_token_ids = config.defined;
  // The rank lookup covers exactly those ids (the special tokens come later).
  config.whole_tokens = std::move(rank_of);
  config.whole_tokens_built = true;
  std::string pattern_name = spec.pattern.empty() ? pattern_from_file_name(spec.model) : spec.pattern;
  std::string pattern = pattern_name;
  std::string description = "regex";
  for (const auto& known : known_encodings()) {
    if (pattern_name != known.name) continue;
    pattern = known.pattern;
    description = known.name;
    // The encoding's special tokens, when the rank file is the encoding's.
    if (num_ranks == known.num_ranks) {
      for (const auto& [text, id] : known.specials) {
        const auto index = static_cast<std::size_t>(id);
        if (index >= config.token_bytes.size()) {
          config.token_bytes.resize(index + 1);
          config.defined.resize(index + 1, false);
        }
        config.token_bytes[index] = text;
        config.defined[index] = true;
        if (text == "<|endoftext|>") config.eod_id = id;
      }
    }
  }
  PreTokenizerStage stage;
  stage.splitter = std::make_unique<RegexSplitter>(pattern, RegexDialect::kTiktoken);
  config.stages.push_back(std::move(stage));
  config.name = str_cat("tiktoken ", description, " (", config.token_bytes.size(), " ids) from ", spec.model);
  return make_byte_level_bpe(std::move(config));
}

}  // namespace dufu::dataprep::tokenizers
