// The byte-pair merge loop (its short-piece scan, its heap for long pieces, the dense
// table of byte pairs) against a naive merge written here: on random strings over a
// small alphabet, with a random vocabulary built the way tiktoken's is (every pair
// whose bytes form a token merges, priority = rank, so equal priorities are common)
// and one built the way a merges.txt is (one priority per merge line).
#include "tokenizers/byte_pair_encoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace dufu::dataprep {
namespace {

struct Merge {
  std::uint32_t priority;
  std::int32_t merged;
};
using MergeTable = std::map<std::pair<std::int32_t, std::int32_t>, Merge>;

// tiktoken's _byte_pair_merge without its tricks: the lowest priority, leftmost first.
std::vector<std::int32_t> naive_merge(const std::string& piece, const MergeTable& merges) {
  std::vector<std::int32_t> tokens;
  for (const char c : piece) tokens.push_back(static_cast<unsigned char>(c));
  for (;;) {
    std::size_t best = tokens.size();
    std::uint32_t lowest = UINT32_MAX;
    for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
      const auto found = merges.find({tokens[i], tokens[i + 1]});
      if (found != merges.end() && found->second.priority < lowest) {
        lowest = found->second.priority;
        best = i;
      }
    }
    if (best == tokens.size()) return tokens;
    tokens[best] = merges.at({tokens[best], tokens[best + 1]}).merged;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

// Tokens 0-255 are the bytes; the others concatenations of two earlier tokens over
// `alphabet` (ids in creation order, so a token's parts come before it).
std::vector<std::string> random_vocabulary(std::mt19937& rng, const std::string& alphabet, std::size_t extra) {
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.emplace_back(1, static_cast<char>(byte));
  std::vector<std::size_t> usable;
  for (const char c : alphabet) usable.push_back(static_cast<unsigned char>(c));
  while (tokens.size() < 256 + extra) {
    const std::string joined = tokens[usable[rng() % usable.size()]] + tokens[usable[rng() % usable.size()]];
    if (joined.size() > 12 || std::find(tokens.begin(), tokens.end(), joined) != tokens.end()) continue;
    usable.push_back(tokens.size());
    tokens.push_back(joined);
  }
  return tokens;
}

std::string random_piece(std::mt19937& rng, const std::string& alphabet, std::size_t length) {
  std::string piece;
  for (std::size_t k = 0; k < length; ++k) piece += alphabet[rng() % alphabet.size()];
  return piece;
}

void expect_naive_results(const BytePairModel& model, const MergeTable& merges, const std::string& alphabet,
                          std::mt19937& rng) {
  BytePairModel::Scratch scratch;
  // Lengths across the short scan (up to 96 bytes) and the heap beyond.
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t length = 2 + rng() % (trial % 4 == 0 ? 400 : 100);
    const std::string piece = random_piece(rng, alphabet, length);
    std::vector<std::int32_t> ids;
    model.encode(piece, scratch, &ids);
    ASSERT_EQ(ids, naive_merge(piece, merges)) << "piece '" << piece << "' (" << length << " bytes)";
  }
}

TEST(BytePairEncoder, TiktokenStyleRanksEqualTheNaiveMerge) {
  std::mt19937 rng(12);
  const std::string alphabet = "ab\xD0\xBE ";
  const auto tokens = random_vocabulary(rng, alphabet, 300);
  // Every pair of tokens whose bytes are a token merges into it at its rank.
  MergeTable merges;
  BytePairModel model;
  for (int byte = 0; byte < 256; ++byte) model.set_byte_token(static_cast<unsigned char>(byte), byte);
  std::map<std::string, std::int32_t> ids;
  for (std::size_t id = 0; id < tokens.size(); ++id) ids.emplace(tokens[id], static_cast<std::int32_t>(id));
  for (std::size_t left = 0; left < tokens.size(); ++left) {
    for (std::size_t right = 0; right < tokens.size(); ++right) {
      const auto found = ids.find(tokens[left] + tokens[right]);
      if (found == ids.end()) continue;
      const auto l = static_cast<std::int32_t>(left), r = static_cast<std::int32_t>(right);
      merges[{l, r}] = Merge{static_cast<std::uint32_t>(found->second), found->second};
      model.add_merge(l, r, static_cast<std::uint32_t>(found->second), found->second);
    }
  }
  model.finish(tokens.size());
  expect_naive_results(model, merges, alphabet, rng);
}

// A merges.txt-style model whose priorities are first_priority + stride * its shuffled line.
void expect_merges_txt_style_naive_results(std::uint32_t first_priority, std::uint32_t stride) {
  std::mt19937 rng(7);
  const std::string alphabet = "xyz\xE3\x81";
  const auto tokens = random_vocabulary(rng, alphabet, 300);
  // One merge per created token, of the two parts it was made from, at a shuffled line.
  std::vector<std::uint32_t> lines(tokens.size() - 256);
  for (std::size_t k = 0; k < lines.size(); ++k) lines[k] = static_cast<std::uint32_t>(k);
  std::shuffle(lines.begin(), lines.end(), rng);
  MergeTable merges;
  BytePairModel model;
  for (int byte = 0; byte < 256; ++byte) model.set_byte_token(static_cast<unsigned char>(byte), byte);
  std::map<std::string, std::int32_t> ids;
  for (std::size_t id = 0; id < 256; ++id) ids.emplace(tokens[id], static_cast<std::int32_t>(id));
  for (std::size_t id = 256; id < tokens.size(); ++id) {
    // The first split into two earlier tokens: the pair it was made from or another.
    for (std::size_t cut = 1; cut < tokens[id].size(); ++cut) {
      const auto left = ids.find(tokens[id].substr(0, cut));
      const auto right = ids.find(tokens[id].substr(cut));
      if (left == ids.end() || right == ids.end()) continue;
      const auto merged = static_cast<std::int32_t>(id);
      const std::uint32_t priority = first_priority + stride * lines[id - 256];
      merges[{left->second, right->second}] = Merge{priority, merged};
      model.add_merge(left->second, right->second, priority, merged);
      break;
    }
    ids.emplace(tokens[id], static_cast<std::int32_t>(id));
  }
  model.finish(tokens.size());
  expect_naive_results(model, merges, alphabet, rng);
}

TEST(BytePairEncoder, MergesTxtStylePrioritiesEqualTheNaiveMerge) { expect_merges_txt_style_naive_results(0, 1); }

// The short scan keys a merge by priority << 7 | offset in 32 bits: priorities up to
// 2^25 - 2 take it (the highest of the first model is that), larger ones the heap
// (the second's reach 299 << 23; in the short scan's keys they would wrap).
TEST(BytePairEncoder, PrioritiesAtAndBeyondTheShortScansLimitEqualTheNaiveMerge) {
  expect_merges_txt_style_naive_results((1U << 25) - 2 - 299, 1);
  expect_merges_txt_style_naive_results(0, 1U << 23);
}

}  // namespace
}  // namespace dufu::dataprep
