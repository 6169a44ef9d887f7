// CausalLMDataset: Megatron-core GPTDataset's split, epochs, document/sample/shuffle
// indices (docs/index-algorithms.md) rebuilt bit for bit, so a run can switch between
// dufu and Megatron on the same shard and see the same samples in the same order.
// The indices are cached as .npy files Megatron's numpy could load, keyed on every
// input that changes them (OSLO's key forgot the split).
#include "dufu/dataprep/causal_lm_dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>
#include <string_view>
#include <system_error>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/common/npy.h"
#include "dufu/common/numpy_random.h"
#include "causal_lm_indices.h"
#include "index_build_stop.h"
#include "sized_array.h"

namespace dufu::dataprep {

namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
// Megatron's _build_shuffle_index switches to int64 at iinfo(uint32).max - 1.
constexpr std::uint64_t kShuffleInt64From = std::numeric_limits<std::uint32_t>::max() - 1ULL;
constexpr const char* kPartNames[] = {"train", "validation", "test"};

constexpr char kDocumentIndexFile[] = "document_index.npy";
constexpr char kSampleIndexFile[] = "sample_index.npy";
constexpr char kShuffleIndexFile[] = "shuffle_index.npy";

// Shortest text that reads back as the same double, so equal weights describe equally.
std::string format_double(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// Megatron reads every run of [.0-9] as a number; dufu accepts the same separators it
// documents (',' and '/') and rejects anything else instead of guessing.
std::vector<double> parse_split_weights(const std::string& split) {
  std::vector<double> weights;
  std::size_t begin = 0;
  while (true) {
    std::size_t end = split.find_first_of(",/", begin);
    if (end == std::string::npos) end = split.size();
    std::string_view part(split.data() + begin, end - begin);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    double value = 0.0;
    const auto result = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || result.ec != std::errc() || result.ptr != part.data() + part.size() ||
        !(value >= 0.0) || !std::isfinite(value)) {
      DUFU_FAIL("bad split '", split, "': expected up to 3 non-negative weights separated by ',' or '/', like \"969,30,1\"");
    }
    weights.push_back(value);
    if (end == split.size()) break;
    begin = end + 1;
  }
  if (weights.size() > 3) {
    DUFU_FAIL("bad split '", split, "': at most 3 parts (train, validation, test), got ", weights.size());
  }
  weights.resize(3, 0.0);
  if (!(weights[0] + weights[1] + weights[2] > 0.0)) {
    DUFU_FAIL("bad split '", split, "': the weights sum to zero");
  }
  return weights;
}

// Python's round() on a float: nearest, ties to even (the default FP rounding mode).
std::int64_t round_half_even(double value) { return static_cast<std::int64_t>(std::nearbyint(value)); }

// Megatron's helpers.build_sample_idx picks int64 when max(len(document_index),
// sizes.max()) exceeds INT32_MAX; `longest_sequence` stands for sizes.max() (same
// verdict for every shard Megatron reads, whose lengths are int32).
bool sample_index_needs_int64(std::uint64_t document_index_size, std::uint64_t longest_sequence) {
  return std::max(document_index_size, longest_sequence) > static_cast<std::uint64_t>(kInt32Max);
}

template <typename To>
std::vector<To> narrow_copy(const std::vector<std::int64_t>& values) {
  std::vector<To> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<To>(values[i]);
  return out;
}

void write_indices(const std::string& dir, const CausalLMIndices& indices, std::uint64_t longest_sequence) {
  write_npy<std::int32_t>(dir + "/" + kDocumentIndexFile, indices.document_index);
  const std::uint64_t rows = indices.sample_index.size() / 2;
  if (sample_index_needs_int64(indices.document_index.size(), longest_sequence)) {
    write_npy<std::int64_t>(dir + "/" + kSampleIndexFile, indices.sample_index, {rows, 2});
  } else {
    write_npy<std::int32_t>(dir + "/" + kSampleIndexFile, narrow_copy<std::int32_t>(indices.sample_index),
                            {rows, 2});
  }
  if (indices.shuffle_index.size() >= kShuffleInt64From) {
    write_npy<std::int64_t>(dir + "/" + kShuffleIndexFile, indices.shuffle_index);
  } else {
    write_npy<std::uint32_t>(dir + "/" + kShuffleIndexFile, narrow_copy<std::uint32_t>(indices.shuffle_index));
  }
}

}  // namespace

const char* data_order_name(DataOrder order) { return order == DataOrder::kStable ? "stable" : "megatron"; }

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) DUFU_FAIL(what, " overflows 64 bits (", a, " x ", b, ")");
  return product;
}

std::string SplitSpec::describe() const {
  if (megatron_split) {
    const std::vector<double> weights = parse_split_weights(*megatron_split);
    const char* name = megatron_part >= 0 && megatron_part < 3 ? kPartNames[megatron_part] : "?";
    return str_cat("megatron ", format_double(weights[0]), ",", format_double(weights[1]), ",",
                   format_double(weights[2]), " part ", megatron_part, " (", name, ")");
  }
  return str_cat("documents [", format_double(start_weight), ", ", format_double(end_weight), ")");
}

std::vector<std::uint64_t> megatron_split_bookends(const std::string& split, std::uint64_t num_elements) {
  const std::vector<double> weights = parse_split_weights(split);
  const double sum = weights[0] + weights[1] + weights[2];
  std::vector<std::int64_t> bookends{0};
  for (const double weight : weights) {
    const double fraction = weight / sum;
    bookends.push_back(bookends.back() + round_half_even(fraction * static_cast<double>(num_elements)));
  }
  const std::int64_t shift = bookends.back() - static_cast<std::int64_t>(num_elements);
  for (std::size_t i = 1; i < bookends.size(); ++i) bookends[i] -= shift;
  std::vector<std::uint64_t> result;
  for (std::size_t i = 0; i < bookends.size(); ++i) {
    // Rounding moves each bookend by at most one per part; anything else is a bug.
    DUFU_CHECK(bookends[i] >= 0 && (i == 0 || bookends[i] >= bookends[i - 1]), "split '", split, "' on ",
               num_elements, " elements");
    result.push_back(static_cast<std::uint64_t>(bookends[i]));
  }
  return result;
}

std::pair<std::uint64_t, std::uint64_t> split_document_range(const SplitSpec& split,
                                                             std::uint64_t num_documents) {
  std::pair<std::uint64_t, std::uint64_t> range;
  if (split.megatron_split) {
    if (split.megatron_part < 0 || split.megatron_part > 2) {
      DUFU_FAIL("bad split part ", split.megatron_part, " of '", *split.megatron_split,
                "': expected 0 (train), 1 (validation) or 2 (test)");
    }
    const auto bookends = megatron_split_bookends(*split.megatron_split, num_documents);
    const auto part = static_cast<std::size_t>(split.megatron_part);
    range = {bookends[part], bookends[part + 1]};
  } else {
    if (!(split.start_weight >= 0.0 && split.start_weight <= split.end_weight && split.end_weight <= 1.0)) {
      DUFU_FAIL("bad split ", split.describe(), ": expected 0 <= start_weight <= end_weight <= 1");
    }
    const double n = static_cast<double>(num_documents);
    range = {static_cast<std::uint64_t>(round_half_even(split.start_weight * n)),
             static_cast<std::uint64_t>(round_half_even(split.end_weight * n))};
  }
  if (range.first >= range.second) {
    DUFU_FAIL("split ", split.describe(), " selects no documents (of ", num_documents, ")");
  }
  return range;
}

SplitTokens measure_split(const std::vector<std::int32_t>& sequence_ids,
                          const std::function<std::uint64_t(std::uint64_t)>& sequence_length, std::uint64_t seq_length,
                          const std::atomic<bool>* stop) {
  if (seq_length == 0) DUFU_FAIL("seq_length must be at least 1");
  if (seq_length >= static_cast<std::uint64_t>(kInt32Max)) {
    DUFU_FAIL("seq_length ", seq_length, " is too long (Megatron stores it as int32)");
  }
  if (sequence_ids.empty()) DUFU_FAIL("the split has no sequences");
  const std::uint64_t m = sequence_ids.size();
  if (m > static_cast<std::uint64_t>(kInt32Max)) {
    DUFU_FAIL("the split has ", m, " sequences, more than an int32 document index can address");
  }
  // Lengths by position in the split, fetched once: the walk then reads a plain array
  // instead of calling through std::function per document.
  SplitTokens split;
  split.sizes.resize(m);
  for (std::uint64_t k = 0; k < m; ++k) {
    if ((k & kStopCheckMask) == 0) throw_if_stopped(stop);
    if (sequence_ids[k] < 0) DUFU_FAIL("negative sequence id ", sequence_ids[k], " in the split");
    const std::uint64_t length = sequence_length(static_cast<std::uint64_t>(sequence_ids[k]));
    if (__builtin_add_overflow(split.tokens, length, &split.tokens) ||
        split.tokens > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      DUFU_FAIL("the split's token count overflows int64");
    }
    split.sizes[k] = static_cast<std::int64_t>(length);
  }
  if (split.tokens < seq_length + 1) {
    DUFU_FAIL("seq_length ", seq_length, " is longer than the data (", split.tokens, " tokens in the split)");
  }
  return split;
}

std::vector<std::int32_t> document_positions(std::uint64_t epochs, std::uint64_t sequences) {
  const std::uint64_t total_entries = checked_mul(epochs, sequences, "epochs x sequences");
  std::vector<std::int32_t> order = sized_array<std::int32_t>(
      total_entries, str_cat("the document index of ", epochs, " epochs x ", sequences, " documents"));
  for (std::uint64_t e = 0; e < epochs; ++e) {
    std::iota(order.begin() + static_cast<std::ptrdiff_t>(e * sequences),
              order.begin() + static_cast<std::ptrdiff_t>((e + 1) * sequences), 0);
  }
  return order;
}

std::vector<std::int64_t> walk_samples(const std::vector<std::int64_t>& sizes, const std::vector<std::int32_t>& order,
                                       std::uint64_t seq_length, std::uint64_t samples, const std::atomic<bool>* stop) {
  // Megatron's build_sample_idx walk: S+1 tokens per sample, the next sample starting
  // on the previous one's last token.
  std::vector<std::int64_t> sample_index =
      sized_array<std::int64_t>(2 * (samples + 1), str_cat("the sample index of ", samples, " samples"));
  const std::int64_t last_position = static_cast<std::int64_t>(order.size()) - 1;
  const std::int64_t window = static_cast<std::int64_t>(seq_length) + 1;
  std::int64_t position = 0;
  std::int64_t offset = 0;
  sample_index[0] = 0;
  sample_index[1] = 0;
  throw_if_stopped(stop);
  for (std::uint64_t s = 1; s <= samples; ++s) {
    if ((s & kStopCheckMask) == 0) throw_if_stopped(stop);
    std::int64_t remaining = window;
    while (remaining != 0) {
      const std::int64_t available = sizes[static_cast<std::size_t>(order[position])] - offset;
      remaining -= available;
      if (remaining <= 0) {
        offset += remaining + available - 1;
        remaining = 0;
      } else {
        if (position == last_position) {
          // Unreachable while the samples fit the document index's tokens; kept as
          // Megatron has it.
          offset = sizes[static_cast<std::size_t>(order[position])] - 1;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    sample_index[2 * s] = position;
    sample_index[2 * s + 1] = offset;
  }
  return sample_index;
}

CausalLMIndices build_causal_lm_indices(const std::vector<std::int32_t>& sequence_ids,
                                        const std::function<std::uint64_t(std::uint64_t)>& sequence_length,
                                        std::uint64_t seq_length, std::optional<std::uint64_t> num_samples,
                                        std::uint32_t seed, const std::atomic<bool>* stop, DataOrder data_order) {
  const auto check_stop = [stop] { throw_if_stopped(stop); };
  const SplitTokens split = measure_split(sequence_ids, sequence_length, seq_length, stop);
  if (data_order == DataOrder::kStable) {
    return build_stable_causal_lm_indices(sequence_ids, split, seq_length, num_samples, seed, stop);
  }
  const std::uint64_t m = sequence_ids.size();
  const std::uint64_t S = seq_length;
  const std::uint64_t T = split.tokens;

  // E = smallest E >= 1 with E*T >= N*S + 1 (Megatron's _get_num_epochs).
  std::uint64_t epochs = 1;
  if (num_samples) {
    const unsigned __int128 needed = static_cast<unsigned __int128>(*num_samples) * S + 1;
    const unsigned __int128 e = (needed + T - 1) / T;
    if (e > std::numeric_limits<std::uint32_t>::max()) {
      DUFU_FAIL(*num_samples, " samples of ", S, " tokens need ", static_cast<std::uint64_t>(e),
                " epochs of the split (", T, " tokens), too many");
    }
    epochs = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(e));
  }
  const std::uint64_t total_tokens = checked_mul(epochs, T, "epochs x tokens");
  if (total_tokens > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    DUFU_FAIL("epochs x tokens (", total_tokens, ") exceeds int64");
  }

  bool separate_final_epoch = false;
  const std::uint64_t samples_before_final = epochs > 1 ? ((epochs - 1) * T - 1) / S : 0;
  if (epochs > 1) {
    const auto from_final = static_cast<std::int64_t>(*num_samples) - static_cast<std::int64_t>(samples_before_final);
    const std::uint64_t per_epoch = (T - 1) / S;
    // Python's int(0.80 * per_epoch): a float product, truncated.
    const auto threshold = static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
    separate_final_epoch = from_final < threshold;
  }

  NumpyRandomState rng(seed);

  // Positions into the split rather than sequence ids: shuffles depend only on the
  // length of the array, and positions let the walk index `sizes` directly.
  std::vector<std::int32_t> order = document_positions(epochs, m);
  check_stop();
  if (separate_final_epoch) {
    const std::size_t first = (epochs - 1) * m;
    rng.shuffle(std::span<std::int32_t>(order.data(), first));
    rng.shuffle(std::span<std::int32_t>(order.data() + first, m));
  } else {
    rng.shuffle(std::span<std::int32_t>(order));
  }

  const std::uint64_t n = (total_tokens - 1) / S;
  std::vector<std::int64_t> sample_index = walk_samples(split.sizes, order, S, n, stop);

  check_stop();
  const std::uint64_t first_part = separate_final_epoch ? samples_before_final : n;
  std::vector<std::int64_t> shuffle_index = sized_array<std::int64_t>(n, str_cat("the shuffle index of ", n, " samples"));
  std::iota(shuffle_index.begin(), shuffle_index.end(), std::int64_t{0});
  rng.shuffle(std::span<std::int64_t>(shuffle_index.data(), first_part));
  if (first_part < n) rng.shuffle(std::span<std::int64_t>(shuffle_index.data() + first_part, n - first_part));

  return indices_of(std::move(order), std::move(sample_index), std::move(shuffle_index), sequence_ids, epochs,
                    separate_final_epoch, stop);
}

CausalLMIndices indices_of(std::vector<std::int32_t> order, std::vector<std::int64_t> sample_index,
                           std::vector<std::int64_t> shuffle_index, const std::vector<std::int32_t>& sequence_ids,
                           std::uint64_t epochs, bool separate_final_epoch, const std::atomic<bool>* stop) {
  throw_if_stopped(stop);  // the last look before the caller publishes the indices
  for (auto& entry : order) entry = sequence_ids[static_cast<std::size_t>(entry)];
  CausalLMIndices indices;
  indices.document_index = std::move(order);
  indices.sample_index = std::move(sample_index);
  indices.shuffle_index = std::move(shuffle_index);
  indices.num_epochs = epochs;
  indices.separate_final_epoch = separate_final_epoch;
  return indices;
}

// Either owns the arrays (no cache) or maps the cache's .npy files; accessors hide
// which of Megatron's dtypes the files hold.
struct CausalLMDataset::Arrays {
  CausalLMIndices owned;
  std::optional<NpyArray> document_file, sample_file, shuffle_file;
  std::span<const std::int32_t> document;
  const std::int32_t* sample32 = nullptr;
  const std::int64_t* sample64 = nullptr;
  const std::uint32_t* shuffle32 = nullptr;
  const std::int64_t* shuffle64 = nullptr;
  std::uint64_t num_samples = 0;
  std::uint64_t num_epochs = 0;

  std::int64_t sample(std::uint64_t k) const { return sample32 != nullptr ? sample32[k] : sample64[k]; }
  std::int64_t shuffle(std::uint64_t i) const {
    return shuffle32 != nullptr ? static_cast<std::int64_t>(shuffle32[i]) : shuffle64[i];
  }
};

CausalLMDataset::CausalLMDataset(std::shared_ptr<const IndexedDataset> shard, CausalLMOptions options)
    : shard_(std::move(shard)), options_(std::move(options)), arrays_(std::make_unique<Arrays>()) {
  if (!shard_) DUFU_FAIL("CausalLMDataset needs a shard");
  // Only the construction can be stopped; the flag's owner need not outlive it.
  const std::atomic<bool>* const stop = std::exchange(options_.stop, nullptr);
  const std::string& prefix = shard_->prefix();
  std::pair<std::uint64_t, std::uint64_t> documents;
  try {
    documents = split_document_range(options_.split, shard_->num_documents());
  } catch (const Error& e) {
    DUFU_FAIL("'", prefix, "': ", e.what());
  }

  const Index& index = shard_->index();
  const std::uint64_t first_sequence = index.document_index(documents.first);
  const std::uint64_t end_sequence = index.document_index(documents.second);
  if (first_sequence >= end_sequence) {
    DUFU_FAIL("'", prefix, "': split ", options_.split.describe(), " (documents [", documents.first, ", ",
              documents.second, ")) holds no sequences");
  }
  if (end_sequence - 1 > static_cast<std::uint64_t>(kInt32Max)) {
    DUFU_FAIL("'", prefix, "': sequence ids up to ", end_sequence - 1,
              " do not fit Megatron's int32 document index");
  }
  std::vector<std::int32_t> sequence_ids(end_sequence - first_sequence);
  std::iota(sequence_ids.begin(), sequence_ids.end(), static_cast<std::int32_t>(first_sequence));
  const auto length_of = [&index](std::uint64_t seq) { return index.sequence_length(seq); };

  description_ = str_cat("dufu causal-lm index v", kIndexCacheFormatVersion, "\n",
                         "shard: ", file_identity(idx_path(prefix)), " ", file_identity(bin_path(prefix)), "\n",
                         "split: ", options_.split.describe(), "\n",
                         "seq_length: ", options_.seq_length, "\n",
                         "num_samples: ", options_.num_samples ? std::to_string(*options_.num_samples) : "none", "\n",
                         "seed: ", options_.seed, "\n",
                         // Only the stable order says so: Megatron's keys stay those of before.
                         options_.order == DataOrder::kStable ? "order: stable\n" : "");

  Arrays& arrays = *arrays_;
  if (!options_.use_cache) {
    arrays.owned = build_causal_lm_indices(sequence_ids, length_of, options_.seq_length, options_.num_samples,
                                           options_.seed, stop, options_.order);
    arrays.document = arrays.owned.document_index;
    arrays.sample64 = arrays.owned.sample_index.data();
    arrays.shuffle64 = arrays.owned.shuffle_index.data();
    arrays.num_samples = arrays.owned.shuffle_index.size();
    arrays.num_epochs = arrays.owned.num_epochs;
    return;
  }

  const IndexCache cache(options_.cache_dir.empty() ? default_index_cache_dir() : options_.cache_dir);
  cache_path_ = cache.get_or_build(description_, [&](const std::string& temp_dir) {
    const CausalLMIndices built =
        build_causal_lm_indices(sequence_ids, length_of, options_.seq_length, options_.num_samples, options_.seed,
                                stop, options_.order);
    std::uint64_t longest = 0;
    for (const std::int32_t seq : sequence_ids) longest = std::max(longest, index.sequence_length(seq));
    write_indices(temp_dir, built, longest);
  });

  // The cache is trusted only as far as cheap checks go: shapes must be the ones
  // these inputs produce, and get() bounds-checks every entry it follows.
  arrays.document_file.emplace(NpyArray::open(cache_path_ + "/" + kDocumentIndexFile));
  arrays.sample_file.emplace(NpyArray::open(cache_path_ + "/" + kSampleIndexFile));
  arrays.shuffle_file.emplace(NpyArray::open(cache_path_ + "/" + kShuffleIndexFile));
  arrays.document = arrays.document_file->view<std::int32_t>();
  if (arrays.sample_file->descr() == "<i8") {
    arrays.sample64 = arrays.sample_file->view<std::int64_t>().data();
  } else {
    arrays.sample32 = arrays.sample_file->view<std::int32_t>().data();
  }
  if (arrays.shuffle_file->descr() == "<i8") {
    arrays.shuffle64 = arrays.shuffle_file->view<std::int64_t>().data();
  } else {
    arrays.shuffle32 = arrays.shuffle_file->view<std::uint32_t>().data();
  }

  std::uint64_t tokens = 0;
  for (const std::int32_t seq : sequence_ids) tokens += index.sequence_length(seq);
  // Megatron's: the samples E epochs of tokens hold; the stable order's: those that
  // start in the first E - 1 epochs (stable_order.cc).
  const auto expected_samples = [&](std::uint64_t epochs, std::uint64_t tokens) -> std::uint64_t {
    if (options_.order == DataOrder::kStable) {
      return epochs < 2 ? 0 : ((epochs - 1) * tokens + options_.seq_length - 1) / options_.seq_length;
    }
    return (epochs * tokens - 1) / options_.seq_length;
  };
  const std::uint64_t m = sequence_ids.size();
  const std::uint64_t entries = arrays.document.size();
  const std::uint64_t epochs = entries / m;
  const auto& sample_shape = arrays.sample_file->shape();
  const auto& shuffle_shape = arrays.shuffle_file->shape();
  const bool consistent = entries % m == 0 && epochs >= 1 && sample_shape.size() == 2 && sample_shape[1] == 2 &&
                          shuffle_shape.size() == 1 && sample_shape[0] == shuffle_shape[0] + 1 &&
                          tokens > options_.seq_length &&
                          shuffle_shape[0] == expected_samples(epochs, tokens);
  if (!consistent) {
    DUFU_FAIL("index cache '", cache_path_, "' does not hold the arrays of its description (",
              entries, " document entries for ", m, " sequences, ", sample_shape.empty() ? 0 : sample_shape[0],
              " sample rows, ", shuffle_shape.empty() ? 0 : shuffle_shape[0],
              " shuffle entries). HINT: delete that directory to rebuild it");
  }
  arrays.num_samples = shuffle_shape[0];
  arrays.num_epochs = epochs;
}

CausalLMDataset::~CausalLMDataset() = default;

std::uint64_t CausalLMDataset::size() const { return arrays_->num_samples; }

std::uint64_t CausalLMDataset::num_epochs() const { return arrays_->num_epochs; }

std::uint64_t CausalLMDataset::document_index_size() const { return arrays_->document.size(); }

std::int64_t CausalLMDataset::document_index_at(std::uint64_t i) const {
  if (i >= arrays_->document.size()) {
    DUFU_FAIL("document index entry ", i, " is out of range (", arrays_->document.size(), " entries)");
  }
  return arrays_->document[i];
}

std::pair<std::int64_t, std::int64_t> CausalLMDataset::sample_index_at(std::uint64_t i) const {
  if (i > arrays_->num_samples) {
    DUFU_FAIL("sample index row ", i, " is out of range (", arrays_->num_samples + 1, " rows)");
  }
  return {arrays_->sample(2 * i), arrays_->sample(2 * i + 1)};
}

std::int64_t CausalLMDataset::shuffle_index_at(std::uint64_t i) const {
  if (i >= arrays_->num_samples) {
    DUFU_FAIL("shuffle index entry ", i, " is out of range (", arrays_->num_samples, " entries)");
  }
  return arrays_->shuffle(i);
}

void CausalLMDataset::get(std::uint64_t index, std::span<std::int32_t> out) const {
  const Arrays& arrays = *arrays_;
  if (index >= arrays.num_samples) {
    DUFU_FAIL("sample ", index, " is out of range: ", describe(), " has ", arrays.num_samples, " samples");
  }
  if (out.size() != sample_length()) {
    DUFU_FAIL("sample buffer holds ", out.size(), " tokens, expected ", sample_length());
  }
  const std::int64_t j = arrays.shuffle(index);
  const auto corrupt = [&](const char* what) {
    DUFU_FAIL("corrupt indices for sample ", index, " (", what, ") in ",
              cache_path_.empty() ? std::string("memory") : "'" + cache_path_ + "'");
  };
  if (j < 0 || static_cast<std::uint64_t>(j) >= arrays.num_samples) corrupt("shuffle entry out of range");
  const auto row = static_cast<std::uint64_t>(j);
  const std::int64_t first = arrays.sample(2 * row), first_offset = arrays.sample(2 * row + 1);
  const std::int64_t last = arrays.sample(2 * row + 2), last_offset = arrays.sample(2 * row + 3);
  if (first < 0 || last < first || static_cast<std::uint64_t>(last) >= arrays.document.size() ||
      first_offset < 0 || last_offset < 0) {
    corrupt("sample index out of range");
  }

  std::uint64_t written = 0;
  for (std::int64_t p = first; p <= last; ++p) {
    const std::int32_t seq = arrays.document[static_cast<std::size_t>(p)];
    if (seq < 0) corrupt("negative sequence id");
    const auto begin = static_cast<std::uint64_t>(p == first ? first_offset : 0);
    // The last part includes the extra token the labels need.
    const std::uint64_t end = p == last ? static_cast<std::uint64_t>(last_offset) + 1
                                        : shard_->sequence_length(static_cast<std::uint64_t>(seq));
    if (end < begin || end - begin > out.size() - written) corrupt("sample longer than seq_length + 1");
    shard_->read_tokens(static_cast<std::uint64_t>(seq), begin, end - begin, out.data() + written);
    written += end - begin;
  }
  if (written != out.size()) corrupt("sample shorter than seq_length + 1");
}

std::string CausalLMDataset::describe() const {
  return str_cat("causal-lm '", shard_->prefix(), "' (", impl_name(shard_->impl()), "), split ",
                 options_.split.describe(), ", seq_length ", options_.seq_length, ", ", size(), " samples, ",
                 num_epochs(), " epochs, seed ", options_.seed);
}

}  // namespace dufu::dataprep
