// Tests of the causal-LM dataset: Megatron's split bookends, indices bit-identical to
// an independent numpy reference (tests/reference/gpt_indices_reference.py), exact
// sample content on shards whose tokens encode their position, every impl, and a
// shard of more than 2^32 tokens made of holes. The cache as the dataset uses it:
// causal_lm_cache_test.cc.
#include "dufu/dataprep/causal_lm_dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "causal_lm_test_support.h"
#include "support/expect_error.h"
#include "support/synthetic_shard.h"
#include "support/temp_dir.h"
#include "dufu/common/error.h"
#include "dufu/common/npy.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;

namespace fs = std::filesystem;

using dufu::testing::TempDir;
using namespace causal_lm_testing;


std::string run_command(const std::string& command, int* exit_code) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    *exit_code = -1;
    return "popen failed";
  }
  std::array<char, 4096> buffer{};
  std::size_t count = 0;
  while ((count = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), count);
  const int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return output;
}

// Every token of every epoch in document_index order, as synthetic positions: sample j
// (in walk order) is exactly stream[j*S .. j*S + S].
std::vector<std::int32_t> token_stream(const CausalLMDataset& dataset, const std::vector<std::uint64_t>& lengths,
                                       std::uint64_t entries) {
  const std::vector<std::uint64_t> offsets = dufu::testing::synthetic_offsets(lengths);
  std::vector<std::int32_t> stream;
  for (std::uint64_t d = 0; d < entries; ++d) {
    const auto seq = static_cast<std::uint64_t>(dataset.document_index_at(d));
    for (std::uint64_t t = 0; t < lengths[seq]; ++t) stream.push_back(static_cast<std::int32_t>(offsets[seq] + t));
  }
  return stream;
}

// --- Megatron's split ---------------------------------------------------------------

using Bookends = std::vector<std::uint64_t>;

TEST(MegatronSplitTest, BookendsMatchMegatronsGetSplitIndices) {
  EXPECT_EQ(megatron_split_bookends("969,30,1", 1000), (Bookends{0, 969, 999, 1000}));
  EXPECT_EQ(megatron_split_bookends("1,1,1", 10), (Bookends{0, 4, 7, 10}));
  EXPECT_EQ(megatron_split_bookends("100,0,0", 7), (Bookends{0, 7, 7, 7}));
  EXPECT_EQ(megatron_split_bookends("98,1,1", 50), (Bookends{0, 50, 50, 50}));
  EXPECT_EQ(megatron_split_bookends("1,1,1", 1), (Bookends{0, 1, 1, 1}));
}

TEST(MegatronSplitTest, RoundsHalfToEvenLikePython) {
  // 2.5 and 2.5 round down to 2 (half-up would give {0, 2, 5, 10}).
  EXPECT_EQ(megatron_split_bookends("1,1,2", 10), (Bookends{0, 3, 5, 10}));
  EXPECT_EQ(megatron_split_bookends("1,1", 5), (Bookends{0, 3, 5, 5}));
  // 3.5 rounds up to 4 twice, then the correction pulls everything back by one.
  EXPECT_EQ(megatron_split_bookends("1,1", 7), (Bookends{0, 3, 7, 7}));
}

TEST(MegatronSplitTest, SlashesCommasAndShortSplits) {
  EXPECT_EQ(megatron_split_bookends("969/30/1", 1000), megatron_split_bookends("969,30,1", 1000));
  EXPECT_EQ(megatron_split_bookends("969, 30, 1", 1000), megatron_split_bookends("969,30,1", 1000));
  EXPECT_EQ(megatron_split_bookends("1", 9), (Bookends{0, 9, 9, 9}));
  EXPECT_EQ(megatron_split_bookends("0.9,0.1", 10), (Bookends{0, 9, 10, 10}));
}

TEST(MegatronSplitTest, RejectsMalformedSplits) {
  for (const char* bad : {"", "a,b", "1,2,3,4", "0,0,0", "-1,2", "1,,2", "1;2"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { megatron_split_bookends(bad, 10); }, {"split"});
  }
}

TEST(SplitDocumentRangeTest, MegatronPartsAndOsloFractions) {
  EXPECT_EQ(split_document_range(megatron("8,1,1", 0), 60), std::make_pair(std::uint64_t{0}, std::uint64_t{48}));
  EXPECT_EQ(split_document_range(megatron("8,1,1", 1), 60), std::make_pair(std::uint64_t{48}, std::uint64_t{54}));
  EXPECT_EQ(split_document_range(megatron("8,1,1", 2), 60), std::make_pair(std::uint64_t{54}, std::uint64_t{60}));
  // 2.5 -> 2 and 7.5 -> 8: both half-even.
  EXPECT_EQ(split_document_range(oslo(0.25, 0.75), 10), std::make_pair(std::uint64_t{2}, std::uint64_t{8}));
  EXPECT_EQ(split_document_range(oslo(0.0, 1.0), 3), std::make_pair(std::uint64_t{0}, std::uint64_t{3}));
}

TEST(SplitDocumentRangeTest, AnEmptyPartIsAnErrorNamingTheSplit) {
  expect_error([] { split_document_range(megatron("969,30,1", 2), 10); },
               {"megatron 969,30,1 part 2 (test)", "no documents", "10"});
  expect_error([] { split_document_range(oslo(0.5, 0.5), 10); }, {"documents [0.5, 0.5)", "no documents"});
  expect_error([] { split_document_range(oslo(0.5, 0.2), 10); }, {"start_weight"});
  expect_error([] { split_document_range(megatron("8,1,1", 3), 10); }, {"part 3"});
}

TEST(SplitSpecTest, DescriptionIsCanonical) {
  EXPECT_EQ(megatron("969/30/1", 0).describe(), megatron("969, 30,1", 0).describe());
  EXPECT_EQ(megatron("969,30,1", 0).describe(), "megatron 969,30,1 part 0 (train)");
  EXPECT_NE(megatron("969,30,1", 0).describe(), megatron("969,30,1", 1).describe());
  EXPECT_EQ(megatron("90,10", 1).describe(), "megatron 90,10,0 part 1 (validation)");
  EXPECT_EQ(oslo(0.1, 0.9).describe(), "documents [0.1, 0.9)");
}

// --- bit-identical to numpy -----------------------------------------------------------

struct ReferenceCase {
  std::string name;
  std::vector<std::uint64_t> lengths;
  std::uint64_t seq_length;
  std::optional<std::uint64_t> num_samples;
  std::uint32_t seed;
  SplitSpec split;
  std::string reference_split_args;  // how the script is told the same split
  std::uint64_t expected_epochs;
  bool expected_separate;
};

std::vector<ReferenceCase> reference_cases() {
  const auto sixty = varied_lengths(60);  // 1266 tokens
  const SplitSpec all = oslo(0.0, 1.0);
  const std::string all_args = "--begin 0 --end 60";
  return {
      // The worked example of docs/index-algorithms.md, section 5: seed 5 leaves [0,1,2] in place.
      {"formats_example", {5, 3, 7}, 4, std::nullopt, 5, all, "--begin 0 --end 3", 1, false},
      {"one_epoch_seed0_s64", sixty, 64, std::nullopt, 0, all, all_args, 1, false},
      {"few_samples_s7_train", sixty, 7, 10, 1234, megatron("8,1,1", 0), "--split 8,1,1 --part 0", 1, false},
      {"one_epoch_s1_valid", sixty, 1, std::nullopt, 7, megatron("8,1,1", 1), "--split 8,1,1 --part 1", 1, false},
      {"three_epochs_separate", sixty, 64, 40, 1234, all, all_args, 3, true},
      {"three_epochs_joined", sixty, 64, 55, 1234, all, all_args, 3, false},
      {"two_epochs_separate", sixty, 64, 25, 0, all, all_args, 2, true},
      {"two_epochs_joined", sixty, 64, 36, 7, all, all_args, 2, false},
      {"two_epochs_joined_s7", sixty, 7, 270, 0, megatron("8,1,1", 0), "--split 8,1,1 --part 0", 2, false},
      {"two_epochs_separate_s1", sixty, 1, 200, 7, megatron("8,1,1", 2), "--split 8,1,1 --part 2", 2, true},
      {"two_epochs_joined_s1", sixty, 1, 290, 1234, megatron("8,1,1", 2), "--split 8,1,1 --part 2", 2, false},
      {"many_epochs_oslo_range", sixty, 64, 1000, 0, oslo(10.0 / 60, 50.0 / 60), "--begin 10 --end 50", 76, false},
      {"megatron_default_split", sixty, 7, std::nullopt, 1234, megatron("969,30,1", 0), "--split 969,30,1 --part 0",
       1, false},
  };
}

std::map<std::string, std::string> read_meta(const std::string& path) {
  std::map<std::string, std::string> meta;
  std::istringstream in(dufu::testing::read_all(path));
  std::string key, value;
  while (in >> key >> value) meta[key] = value;
  return meta;
}

template <typename T>
void expect_same_values(const NpyArray& ours, const NpyArray& theirs) {
  const auto a = ours.view<T>();
  const auto b = theirs.view<T>();
  ASSERT_EQ(a.size(), b.size());
  const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin());
  EXPECT_TRUE(mismatch.first == a.end()) << "first difference at element " << (mismatch.first - a.begin());
}

void expect_same_npy(const std::string& ours_path, const std::string& theirs_path) {
  SCOPED_TRACE(ours_path);
  const NpyArray ours = NpyArray::open(ours_path);
  const NpyArray theirs = NpyArray::open(theirs_path);
  ASSERT_EQ(ours.descr(), theirs.descr());
  ASSERT_EQ(ours.shape(), theirs.shape());
  if (ours.descr() == "<i4") {
    expect_same_values<std::int32_t>(ours, theirs);
  } else if (ours.descr() == "<i8") {
    expect_same_values<std::int64_t>(ours, theirs);
  } else if (ours.descr() == "<u4") {
    expect_same_values<std::uint32_t>(ours, theirs);
  } else {
    ADD_FAILURE() << "unexpected dtype " << ours.descr();
  }
}

TEST(CausalLMReferenceTest, IndicesAreBitIdenticalToNumpysMegatronAlgorithm) {
  const std::string script = std::string(DUFU_SOURCE_DIR) + "/tests/reference/gpt_indices_reference.py";
  const char* kFiles[] = {"document_index.npy", "sample_index.npy", "shuffle_index.npy"};
  for (const ReferenceCase& c : reference_cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    std::string sizes_text;
    for (const auto length : c.lengths) sizes_text += std::to_string(length) + "\n";
    dufu::testing::write_all(dir.file("sizes.txt"), sizes_text);
    const auto shard = make_shard(dir, "shard", c.lengths);
    CausalLMOptions options = in_memory(c.seq_length, c.num_samples, c.seed, c.split);
    options.use_cache = true;
    options.cache_dir = dir.file("cache");
    const CausalLMDataset dataset(shard, options);

    // The script also numpy.load()s dufu's files and compares them with its own arrays.
    const std::string numpy_dir = dir.file("numpy");
    std::string command = std::string(DUFU_REFERENCE_PYTHON) + " " + script + " --sizes " + dir.file("sizes.txt") +
                          " --seq-length " + std::to_string(c.seq_length) + " --seed " + std::to_string(c.seed) +
                          " " + c.reference_split_args + " --out " + numpy_dir + " --compare " + dataset.cache_path();
    if (c.num_samples) command += " --num-samples " + std::to_string(*c.num_samples);
    int exit_code = 0;
    const std::string output = run_command(command, &exit_code);
    ASSERT_EQ(exit_code, 0) << command << "\n" << output;
    const auto meta = read_meta(numpy_dir + "/meta.txt");
    EXPECT_EQ(meta.at("epochs"), std::to_string(c.expected_epochs));
    EXPECT_EQ(meta.at("separate"), c.expected_separate ? "1" : "0");
    for (const char* file : kFiles) expect_same_npy(dataset.cache_path() + "/" + file, numpy_dir + "/" + file);
    EXPECT_EQ(dataset.num_epochs(), c.expected_epochs);
    EXPECT_EQ(std::to_string(dataset.size()), meta.at("samples"));

    // The in-memory builder, which the cache wraps, agrees value by value too.
    const auto range = split_document_range(c.split, c.lengths.size());
    EXPECT_EQ(std::to_string(range.first), meta.at("begin"));
    EXPECT_EQ(std::to_string(range.second), meta.at("end"));
    std::vector<std::int32_t> ids(range.second - range.first);
    std::iota(ids.begin(), ids.end(), static_cast<std::int32_t>(range.first));
    const CausalLMIndices built = build_causal_lm_indices(
        ids, [&](std::uint64_t seq) { return c.lengths[seq]; }, c.seq_length, c.num_samples, c.seed);
    EXPECT_EQ(built.num_epochs, c.expected_epochs);
    EXPECT_EQ(built.separate_final_epoch, c.expected_separate);
    // (The arrays stay open while their views are read: a view lives in the mapping.)
    const NpyArray doc = NpyArray::open(numpy_dir + "/document_index.npy");
    const NpyArray rows = NpyArray::open(numpy_dir + "/sample_index.npy");
    const NpyArray order = NpyArray::open(numpy_dir + "/shuffle_index.npy");
    const auto doc_view = doc.view<std::int32_t>();
    const auto rows_view = rows.view<std::int32_t>();
    const auto order_view = order.view<std::uint32_t>();
    EXPECT_TRUE(std::equal(built.document_index.begin(), built.document_index.end(), doc_view.begin(),
                           doc_view.end()));
    EXPECT_TRUE(std::equal(built.sample_index.begin(), built.sample_index.end(), rows_view.begin(),
                           rows_view.end()));
    EXPECT_TRUE(std::equal(built.shuffle_index.begin(), built.shuffle_index.end(), order_view.begin(),
                           order_view.end()));

  }
}

// Issue 45: the stable order, bit for bit against its numpy reference, and the
// property it exists for: the first N samples of any longer run are the same, across
// epoch boundaries, where Megatron's order moves every sample (checked too, so the
// test can fail).
TEST(CausalLMStableOrderTest, BitIdenticalToNumpyAndThePrefixOfEveryLongerRun) {
  const std::string script = std::string(DUFU_SOURCE_DIR) + "/tests/reference/gpt_indices_reference.py";
  const auto sixty = varied_lengths(60);  // 1266 tokens: 19.8 samples of 64 an epoch
  struct Case {
    std::uint64_t seq_length;
    std::vector<std::optional<std::uint64_t>> lengths;  // num_samples, growing
    SplitSpec split;
    std::string split_args;
  };
  const std::vector<Case> cases = {
      {64, {std::nullopt, 5, 19, 20, 25, 40, 55, 200}, oslo(0.0, 1.0), "--begin 0 --end 60"},
      {7, {10, 170, 270, 900}, megatron("8,1,1", 0), "--split 8,1,1 --part 0"},
      {1, {50, 200, 290, 1000}, megatron("8,1,1", 2), "--split 8,1,1 --part 2"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    std::string sizes_text;
    for (const auto length : sixty) sizes_text += std::to_string(length) + "\n";
    dufu::testing::write_all(dir.file("sizes.txt"), sizes_text);
    const auto shard = make_shard(dir, "shard", sixty);
    std::vector<std::unique_ptr<CausalLMDataset>> stable, megatron_order;
    for (const auto& num_samples : c.lengths) {
      SCOPED_TRACE(str_cat("seq_length ", c.seq_length, ", num_samples ", num_samples ? *num_samples : 0));
      CausalLMOptions options = in_memory(c.seq_length, num_samples, 1234, c.split);
      options.use_cache = true;
      options.cache_dir = dir.file("cache");
      options.order = DataOrder::kStable;
      stable.push_back(std::make_unique<CausalLMDataset>(shard, options));
      options.order = DataOrder::kMegatron;
      megatron_order.push_back(std::make_unique<CausalLMDataset>(shard, options));
      EXPECT_NE(stable.back()->cache_path(), megatron_order.back()->cache_path());
      if (num_samples) {
        EXPECT_GE(stable.back()->size(), *num_samples);
      }

      std::string command = std::string(DUFU_REFERENCE_PYTHON) + " " + script + " --order stable --sizes " +
                            dir.file("sizes.txt") + " --seq-length " + std::to_string(c.seq_length) +
                            " --seed 1234 " + c.split_args + " --out " + dir.file("numpy") + " --compare " +
                            stable.back()->cache_path();
      if (num_samples) command += " --num-samples " + std::to_string(*num_samples);
      int exit_code = 0;
      const std::string output = run_command(command, &exit_code);
      ASSERT_EQ(exit_code, 0) << command << "\n" << output;
    }
    const std::uint64_t window = c.seq_length + 1;
    std::vector<std::int32_t> shorter(window), longer(window);
    bool megatron_moved = false;
    for (std::size_t r = 0; r + 1 < stable.size(); ++r) {
      for (std::uint64_t i = 0; i < stable[r]->size(); ++i) {
        stable[r]->get(i, shorter);
        stable.back()->get(i, longer);
        ASSERT_EQ(shorter, longer) << "sample " << i << " of the run of " << stable[r]->size() << " samples";
      }
      for (std::uint64_t i = 0; i < megatron_order[r]->size() && !megatron_moved; ++i) {
        megatron_order[r]->get(i, shorter);
        megatron_order.back()->get(i, longer);
        megatron_moved = shorter != longer;
      }
    }
    EXPECT_TRUE(megatron_moved) << "Megatron's order kept every prefix too: the cases test nothing";
  }
}

TEST(CausalLMReferenceTest, FormatsExampleRowsAndSamples) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", {5, 3, 7});
  const CausalLMDataset dataset(shard, in_memory(4, std::nullopt, 5));
  ASSERT_EQ(dataset.size(), 3u);
  for (std::uint64_t d = 0; d < 3; ++d) EXPECT_EQ(dataset.document_index_at(d), static_cast<std::int64_t>(d));
  const std::vector<std::pair<std::int64_t, std::int64_t>> rows = {{0, 0}, {0, 4}, {2, 0}, {2, 4}};
  for (std::uint64_t r = 0; r < rows.size(); ++r) EXPECT_EQ(dataset.sample_index_at(r), rows[r]) << r;
  const std::vector<std::vector<std::int32_t>> walk = {{0, 1, 2, 3, 4}, {4, 5, 6, 7, 8}, {8, 9, 10, 11, 12}};
  for (std::uint64_t i = 0; i < dataset.size(); ++i) {
    EXPECT_EQ(sample(dataset, i), walk[static_cast<std::size_t>(dataset.shuffle_index_at(i))]) << i;
  }
}

// --- samples ----------------------------------------------------------------------------

TEST(CausalLMDatasetTest, SamplesAreTheRightRunsOfPositionsAndOverlapByOneToken) {
  TempDir dir;
  const auto lengths = varied_lengths(60);
  const auto shard = make_shard(dir, "shard", lengths);
  for (const auto& [seq_length, num_samples] :
       std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>>{{64, 40}, {7, 500}, {1, std::nullopt}}) {
    SCOPED_TRACE(seq_length);
    const CausalLMDataset dataset(shard, in_memory(seq_length, num_samples, 1234));
    const std::uint64_t entries = dataset.num_epochs() * lengths.size();
    const auto stream = token_stream(dataset, lengths, entries);
    ASSERT_EQ(dataset.size(), (stream.size() - 1) / seq_length);
    std::vector<std::uint64_t> where(dataset.size());
    std::vector<bool> seen(dataset.size(), false);
    for (std::uint64_t i = 0; i < dataset.size(); ++i) {
      const auto j = static_cast<std::uint64_t>(dataset.shuffle_index_at(i));
      ASSERT_LT(j, dataset.size());
      ASSERT_FALSE(seen[j]) << "shuffle index repeats " << j;
      seen[j] = true;
      where[j] = i;
      const auto tokens = sample(dataset, i);
      const std::vector<std::int32_t> expected(stream.begin() + static_cast<std::ptrdiff_t>(j * seq_length),
                                               stream.begin() + static_cast<std::ptrdiff_t>(j * seq_length + seq_length + 1));
      ASSERT_EQ(tokens, expected) << "sample " << i << " (walk position " << j << ")";
    }
    for (std::uint64_t j = 0; j + 1 < dataset.size(); ++j) {
      EXPECT_EQ(sample(dataset, where[j]).back(), sample(dataset, where[j + 1]).front()) << j;
    }
  }
}

TEST(CausalLMDatasetTest, SamplesStayInsideTheirSplit) {
  TempDir dir;
  const auto lengths = varied_lengths(60);
  const auto shard = make_shard(dir, "shard", lengths);
  const auto offsets = dufu::testing::synthetic_offsets(lengths);
  const CausalLMDataset dataset(shard, in_memory(5, 100, 7, megatron("8,1,1", 1)));  // documents [48, 54)
  const auto low = static_cast<std::int32_t>(offsets[48]);
  const auto high = static_cast<std::int32_t>(offsets[53] + lengths[53]);
  for (std::uint64_t i = 0; i < dataset.size(); ++i) {
    for (const std::int32_t token : sample(dataset, i)) {
      ASSERT_GE(token, low);
      ASSERT_LT(token, high);
    }
  }
}

TEST(CausalLMDatasetTest, AllImplsGiveIdenticalSamples) {
  TempDir dir;
  const auto lengths = varied_lengths(45);
  for (const auto& [layout, dtype] : std::vector<std::pair<IndexLayout, DType>>{
           {IndexLayout::kMMIDIDX, DType::kInt32}, {IndexLayout::kTNTIDX, DType::kUInt16}}) {
    const std::string prefix = dir.file(std::string("shard_") + std::string(layout_name(layout)));
    dufu::testing::write_synthetic_shard(prefix, lengths, layout, dtype);
    std::vector<std::vector<std::int32_t>> reference;
    for (const IndexImpl impl : {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached}) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " " + std::string(impl_name(impl)));
      const CausalLMDataset dataset(open_shard(prefix, impl), in_memory(9, 150, 1234));
      std::vector<std::vector<std::int32_t>> samples;
      for (std::uint64_t i = 0; i < dataset.size(); ++i) samples.push_back(sample(dataset, i));
      if (reference.empty()) {
        reference = samples;
        ASSERT_GT(reference.size(), 100u);
      } else {
        EXPECT_EQ(samples, reference);
      }
    }
  }
}

TEST(CausalLMDatasetTest, SizeCountsEveryEpochLikeMegatronsLen) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", varied_lengths(60));  // 1266 tokens
  EXPECT_EQ(CausalLMDataset(shard, in_memory(64, std::nullopt, 1)).size(), 1265u / 64);
  const CausalLMDataset three(shard, in_memory(64, 40, 1));
  EXPECT_EQ(three.num_epochs(), 3u);
  EXPECT_EQ(three.size(), (3u * 1266 - 1) / 64);
  EXPECT_EQ(three.sample_length(), 65u);
  EXPECT_NE(three.describe().find("3 epochs"), std::string::npos) << three.describe();
}

TEST(CausalLMDatasetTest, ClearErrors) {
  TempDir dir;
  const auto shard = make_shard(dir, "shard", {5, 3, 7});
  expect_error([&] { CausalLMDataset(shard, in_memory(15, std::nullopt, 1)); },
               {"seq_length 15 is longer than the data (15 tokens in the split)"});
  expect_error([&] { CausalLMDataset(shard, in_memory(4, std::nullopt, 1, megatron("969,30,1", 2))); },
               {dir.file("shard"), "megatron 969,30,1 part 2 (test)", "no documents"});
  expect_error([&] { CausalLMDataset(nullptr, in_memory(4, std::nullopt, 1)); }, {"shard"});
  expect_error([&] { open_shard(dir.file("missing")); }, {dir.file("missing")});

  const CausalLMDataset dataset(shard, in_memory(4, std::nullopt, 1));
  std::vector<std::int32_t> out(5);
  expect_error([&] { dataset.get(3, out); }, {"sample 3 is out of range"});
  std::vector<std::int32_t> short_out(4);
  expect_error([&] { dataset.get(0, short_out); }, {"expected 5"});

  // A damaged shard is refused when it is opened, naming the file.
  const std::string broken = dir.file("broken");
  dufu::testing::write_synthetic_shard(broken, {5, 3, 7});
  fs::resize_file(bin_path(broken), 10);
  expect_error([&] { open_shard(broken); }, {bin_path(broken)});
}

// --- scale ----------------------------------------------------------------------------

// 3 sequences of 1.5e9 uint16 tokens (4.5e9 tokens, 9 GB of .bin) that cost no disk:
// the .bin is a hole except 2048 recognisable tokens at both ends of each sequence.
constexpr std::uint64_t kHugeLength = 1500000000;
constexpr std::uint64_t kHugeSequences = 3;
constexpr std::uint64_t kMarked = 2048;

std::int32_t marked_token(std::uint64_t seq, std::uint64_t offset) {
  return static_cast<std::int32_t>(1 + (seq * 1000003 + offset * 31) % 65535);
}

std::int32_t huge_token(std::uint64_t seq, std::uint64_t offset) {
  return offset < kMarked || offset >= kHugeLength - kMarked ? marked_token(seq, offset) : 0;
}

template <typename T>
void append(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void write_huge_sparse_shard(const std::string& prefix) {
  std::string idx("MMIDIDX\0\0", 9);
  append<std::uint64_t>(idx, 1);
  append<std::uint8_t>(idx, 8);  // uint16
  append<std::uint64_t>(idx, kHugeSequences);
  append<std::uint64_t>(idx, kHugeSequences + 1);
  for (std::uint64_t s = 0; s < kHugeSequences; ++s) append<std::int32_t>(idx, static_cast<std::int32_t>(kHugeLength));
  for (std::uint64_t s = 0; s < kHugeSequences; ++s) append<std::int64_t>(idx, static_cast<std::int64_t>(s * kHugeLength * 2));
  for (std::uint64_t d = 0; d <= kHugeSequences; ++d) append<std::int64_t>(idx, static_cast<std::int64_t>(d));
  ASSERT_EQ(idx.size(), 34 + 12 * kHugeSequences + 8 * (kHugeSequences + 1));
  dufu::testing::write_all(idx_path(prefix), idx);

  const int fd = ::open(bin_path(prefix).c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kHugeSequences * kHugeLength * 2)), 0);
  for (std::uint64_t s = 0; s < kHugeSequences; ++s) {
    for (const std::uint64_t first : {std::uint64_t{0}, kHugeLength - kMarked}) {
      std::vector<std::uint16_t> tokens(kMarked);
      for (std::uint64_t t = 0; t < kMarked; ++t) tokens[t] = static_cast<std::uint16_t>(marked_token(s, first + t));
      const auto at = static_cast<off_t>((s * kHugeLength + first) * 2);
      ASSERT_EQ(::pwrite(fd, tokens.data(), kMarked * 2, at), static_cast<ssize_t>(kMarked * 2));
    }
  }
  ASSERT_EQ(::close(fd), 0);
}

TEST(CausalLMScaleTest, ShardOfMoreThan2To32TokensReadsTheRightTokensAtBothEnds) {
  TempDir dir;
  const std::string prefix = dir.file("huge");
  ASSERT_NO_FATAL_FAILURE(write_huge_sparse_shard(prefix));
  const std::uint64_t seq_length = 1024;
  const std::uint64_t total = kHugeSequences * kHugeLength;
  for (const IndexImpl impl : {IndexImpl::kMmap, IndexImpl::kLazy}) {
    SCOPED_TRACE(std::string(impl_name(impl)));
    const CausalLMDataset dataset(open_shard(prefix, impl), in_memory(seq_length, 10, 1234));
    const std::uint64_t n = (total - 1) / seq_length;
    ASSERT_EQ(dataset.size(), n);
    ASSERT_EQ(dataset.num_epochs(), 1u);
    EXPECT_EQ(dataset.sample_index_at(0), std::make_pair(std::int64_t{0}, std::int64_t{0}));
    EXPECT_EQ(dataset.sample_index_at(n),
              std::make_pair(std::int64_t{2}, static_cast<std::int64_t>(n * seq_length - 2 * kHugeLength)));

    // The first and last samples of the walk, and the two that cross documents.
    const std::vector<std::uint64_t> rows = {0, (kHugeLength - 1) / seq_length, (2 * kHugeLength - 1) / seq_length,
                                             n - 1};
    std::map<std::uint64_t, std::uint64_t> position_of;
    for (const auto row : rows) position_of[row] = n;
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto it = position_of.find(static_cast<std::uint64_t>(dataset.shuffle_index_at(i)));
      if (it != position_of.end()) it->second = i;
    }
    for (const auto row : rows) {
      SCOPED_TRACE(row);
      ASSERT_LT(position_of[row], n);
      std::vector<std::int32_t> expected;
      for (std::uint64_t p = row * seq_length; p <= row * seq_length + seq_length; ++p) {
        const auto seq = static_cast<std::uint64_t>(dataset.document_index_at(p / kHugeLength));
        expected.push_back(huge_token(seq, p % kHugeLength));
      }
      EXPECT_EQ(sample(dataset, position_of[row]), expected);
    }
  }
}

TEST(CausalLMScaleTest, BillionTokensInAMillionDocumentsBuildInSeconds) {
  const std::uint64_t documents = 1000000;
  std::vector<std::uint64_t> lengths(documents);
  std::uint64_t tokens = 0;
  for (std::uint64_t k = 0; k < documents; ++k) tokens += lengths[k] = 500 + (k * 7919) % 1001;
  std::vector<std::int32_t> ids(documents);
  std::iota(ids.begin(), ids.end(), 0);
  const std::uint64_t seq_length = 2048;
  const std::uint64_t one_epoch = (tokens - 1) / seq_length;

  const auto start = std::chrono::steady_clock::now();
  const CausalLMIndices indices = build_causal_lm_indices(
      ids, [&](std::uint64_t seq) { return lengths[seq]; }, seq_length, one_epoch, 1234);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ timing   ] indices for " << tokens << " tokens in " << documents << " documents: " << seconds
            << " s\n";
  RecordProperty("build_seconds", std::to_string(seconds));

  EXPECT_EQ(indices.num_epochs, 1u);
  ASSERT_EQ(indices.shuffle_index.size(), one_epoch);
  std::vector<std::int32_t> sorted = indices.document_index;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, ids);
  // The last row points at token n*S of the shuffled stream.
  const std::int64_t last_position = indices.sample_index[2 * one_epoch];
  std::uint64_t before = 0;
  for (std::int64_t d = 0; d < last_position; ++d) before += lengths[static_cast<std::size_t>(indices.document_index[d])];
  EXPECT_EQ(before + static_cast<std::uint64_t>(indices.sample_index[2 * one_epoch + 1]), one_epoch * seq_length);
  EXPECT_LT(seconds, 30.0);  // seconds even in sanitizer builds; ~0.1 s in Release
}

}  // namespace
}  // namespace dufu::dataprep
