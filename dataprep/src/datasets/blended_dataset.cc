// Megatron's blending indices, bit for bit, and the dataset that serves a blend from
// them. The greedy choice is Megatron's helper; for many datasets the same choice is
// found with a kinetic tournament instead of scanning every dataset at every sample.
#include "dufu/dataprep/blended_dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <system_error>

#include "dufu/common/error.h"
#include "dufu/common/npy.h"
#include "dufu/dataprep/index_cache.h"
#include "index_build_stop.h"
#include "sized_array.h"

namespace dufu::dataprep {
namespace {

// Megatron stores dataset ids as int16 and asserts fewer than 32767 datasets.
constexpr std::size_t kMaxDatasets = 32766;
// Sample numbers become doubles in the error; above 2^52 they would stop being exact.
constexpr std::uint64_t kMaxBlendSize = std::uint64_t{1} << 52;
// Up to this many datasets a plain scan per sample beats the tournament's bookkeeping.
constexpr std::size_t kPlainScanMaxDatasets = 384;
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

// Megatron's helper is compiled as ISO C++ without -march flags, so w·x is rounded
// before the count is subtracted. Where the target has FMA, keep the compiler from
// fusing the two, which would change which dataset wins a near-tie.
#if defined(__FP_FAST_FMA)
inline void keep_rounded(double& value) { asm volatile("" : "+m"(value)); }
#else
inline void keep_rounded(double&) {}
#endif

// Counts are held as doubles (exact below 2^53): the value Megatron converts its
// int64 counts to before subtracting.
inline double blend_error(double weight, double x, double count) {
  double product = weight * x;
  keep_rounded(product);
  return product - count;
}

// Cache descriptions print every digit; messages print what the user typed.
std::string format_double(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}
std::string shortest(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// numpy's pairwise summation (8 accumulators, blocks of 128), which is what
// numpy.sum does for float64 and hence what Megatron's normalize() divides by.
double numpy_pairwise_sum(const double* values, std::size_t n) {
  if (n < 8) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += values[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = values[j];
    std::size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += values[i + j];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += values[i];
    return sum;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return numpy_pairwise_sum(values, half) + numpy_pairwise_sum(values + half, n - half);
}

void check_blend_weights(const std::vector<double>& weights) {
  if (weights.empty()) DUFU_FAIL("a blend needs at least one dataset");
  if (weights.size() > kMaxDatasets) {
    DUFU_FAIL("a blend takes at most ", kMaxDatasets, " datasets (int16 dataset ids); got ", weights.size());
  }
  for (std::size_t d = 0; d < weights.size(); ++d) {
    if (!std::isfinite(weights[d]) || !(weights[d] > 0.0)) {
      DUFU_FAIL("blend weights must be positive and finite: got ", shortest(weights[d]), " for dataset ", d);
    }
  }
}

void check_blend_size(std::uint64_t size) {
  if (size >= kMaxBlendSize) DUFU_FAIL("blend size ", size, " is too large (limit 2^52 samples)");
}

// Megatron's helper: one scan of the (active) datasets per sample. O(size × datasets).
template <bool kLimited>
void blend_by_scanning(const std::vector<double>& weights_in, const std::vector<std::uint64_t>& limits,
                       const std::atomic<bool>* stop, BlendIndices& out) {
  const std::size_t n = weights_in.size();
  const double* weights = weights_in.data();
  std::vector<double> count_storage(n, 0.0);
  double* counts = count_storage.data();
  std::vector<std::uint8_t> active_storage(n, 1);
  std::uint8_t* active = active_storage.data();
  if constexpr (kLimited) {
    for (std::size_t d = 0; d < n; ++d) active[d] = limits[d] > 0;
  }
  std::int16_t* dataset_index = out.dataset_index.data();
  std::int64_t* dataset_sample_index = out.dataset_sample_index.data();
  const std::size_t size = out.dataset_index.size();
  for (std::size_t s = 0; s < size; ++s) {
    if ((s & kStopCheckMask) == 0) throw_if_stopped(stop);
    const double x = std::max(static_cast<double>(s), 1.0);
    std::size_t best = 0;
    double best_error = std::numeric_limits<double>::lowest();
    for (std::size_t d = 0; d < n; ++d) {
      if (kLimited && !active[d]) continue;
      const double error = blend_error(weights[d], x, counts[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index[s] = static_cast<std::int16_t>(best);
    dataset_sample_index[s] = static_cast<std::int64_t>(counts[best]);
    counts[best] += 1.0;
    if constexpr (kLimited) {
      if (static_cast<std::uint64_t>(counts[best]) == limits[best]) active[best] = 0;
    }
  }
}

// Internal tournament nodes keyed by the step at which their comparison must be
// looked at again: an indexed binary heap, so a node is in it at most once. Looking
// at a node early is harmless, so a node keeps its earliest pending deadline and a
// later one is not sifted in; the node comes up early and is rescheduled then. Only
// earlier deadlines and pops pay for sifting.
class DeadlineHeap {
 public:
  explicit DeadlineHeap(std::size_t nodes) : position_(nodes, kAbsent) {}

  // Makes sure `node` comes up no later than `key` (kNever: no deadline).
  void schedule(std::uint32_t node, std::int64_t key) {
    if (key == kNever) return;
    std::size_t at = position_[node];
    if (at == kAbsent) {
      at = heap_.size();
      heap_.push_back({key, node});
      sift_up(at);
    } else if (key < heap_[at].key) {
      heap_[at].key = key;
      sift_up(at);
    }
  }

  // Pops a node whose deadline is <= `now`; false if there is none.
  bool pop_due(std::int64_t now, std::uint32_t& node) {
    if (heap_.empty() || heap_.front().key > now) return false;
    node = heap_.front().node;
    position_[node] = kAbsent;
    const Entry last = heap_.back();
    heap_.pop_back();
    if (!heap_.empty()) {
      heap_.front() = last;
      sift_down(0);
    }
    return true;
  }

 private:
  static constexpr std::size_t kAbsent = std::numeric_limits<std::size_t>::max();
  struct Entry {
    std::int64_t key;
    std::uint32_t node;
  };

  void place(std::size_t at, Entry entry) {
    heap_[at] = entry;
    position_[entry.node] = at;
  }
  void sift_up(std::size_t at) {
    const Entry entry = heap_[at];
    while (at > 0) {
      const std::size_t parent = (at - 1) / 2;
      if (heap_[parent].key <= entry.key) break;
      place(at, heap_[parent]);
      at = parent;
    }
    place(at, entry);
  }
  void sift_down(std::size_t at) {
    const Entry entry = heap_[at];
    const std::size_t n = heap_.size();
    while (true) {
      std::size_t child = 2 * at + 1;
      if (child >= n) break;
      if (child + 1 < n && heap_[child + 1].key < heap_[child].key) ++child;
      if (entry.key <= heap_[child].key) break;
      place(at, heap_[child]);
      at = child;
    }
    place(at, entry);
  }

  std::vector<Entry> heap_;
  std::vector<std::size_t> position_;
};

// The same choice as blend_by_scanning, found with a kinetic tournament: every
// internal node keeps the winner of its two children's winners (ties to the left,
// i.e. the lower dataset id) and a certificate, the first step at which that outcome
// might change while the two counts stay put. Between certificates nothing is
// evaluated; a pick re-evaluates only the picked leaf's path. Each error is a line in
// x, so a comparison flips at most once per count change.
//
// The certificate must hold for the floating-point comparison, not just the exact
// one. With u = 2^-53, c <= x (counts sum to the sample number) and w <= w_max, each
// computed error is within u·x·(2.01·w_max + 1) of w·x − c, so when the exact gap
// (w_W − w_V)·x − (c_W − c_V) exceeds k·x with k = 8u(w_max + 1) the computed errors
// order the same way. The gap test itself is evaluated with k2 = 4k, whose slack
// covers the rounding of that test and of the expiry computed from it. Inside the
// uncertain band the node is simply re-evaluated at every step, so near-identical
// weights cost speed, never correctness; bit-identical weights with equal counts tie
// exactly forever and need no re-evaluation.
//
// Cost: O(log D) nodes per pick, each an O(log D) heap update, plus the certificate
// events, a few per sample in practice (measured: 1.4 at D = 64, 4 at D = 32766 with
// random weights; none with equal weights). Memory O(D). Only weights that differ by
// less than ~2^-48 sit in the uncertain band and fall back to per-step comparisons.
class TournamentBlender {
 public:
  TournamentBlender(const std::vector<double>& weights, const std::vector<std::uint64_t>* limits)
      : limits_(limits), lines_(weights.size()) {
    for (std::size_t d = 0; d < weights.size(); ++d) lines_[d].weight = weights[d];
    leaves_ = 1;
    while (leaves_ < weights.size()) leaves_ *= 2;
    winner_.assign(2 * leaves_, -1);
    for (std::size_t d = 0; d < weights.size(); ++d) {
      if (limits_ == nullptr || (*limits_)[d] > 0) winner_[leaves_ + d] = static_cast<std::int32_t>(d);
    }
    const double max_weight = *std::max_element(weights.begin(), weights.end());
    certificate_slack_ = 0x1p-48 * (max_weight + 1.0);
    deadlines_ = DeadlineHeap(leaves_);
  }

  void run(const std::atomic<bool>* stop, BlendIndices& out) {
    for (std::size_t node = leaves_ - 1; node >= 1; --node) update(node, 1.0, 1);
    std::size_t picked_leaf = 0;
    for (std::size_t s = 0; s < out.dataset_index.size(); ++s) {
      if ((s & kStopCheckMask) == 0) throw_if_stopped(stop);
      const std::int64_t xi = std::max<std::int64_t>(static_cast<std::int64_t>(s), 1);
      const double x = static_cast<double>(xi);
      for (std::size_t node = picked_leaf / 2; node >= 1; node /= 2) update(node, x, xi);
      for (std::uint32_t due = 0; deadlines_.pop_due(xi, due);) {
        std::size_t node = due;
        while (update(node, x, xi) && node > 1) node /= 2;
      }
      const std::int32_t d = winner_[1];
      DUFU_CHECK(d >= 0);
      out.dataset_index[s] = static_cast<std::int16_t>(d);
      Line& line = lines_[static_cast<std::size_t>(d)];
      out.dataset_sample_index[s] = static_cast<std::int64_t>(line.count);
      line.count += 1.0;
      picked_leaf = leaves_ + static_cast<std::size_t>(d);
      if (limits_ != nullptr && static_cast<std::uint64_t>(line.count) == (*limits_)[d]) winner_[picked_leaf] = -1;
    }
  }

 private:
  // Recomputes `node` from its children at x; true if its winner changed.
  bool update(std::size_t node, double x, std::int64_t xi) {
    const std::int32_t left = winner_[2 * node];
    const std::int32_t right = winner_[2 * node + 1];
    std::int32_t winner;
    std::int64_t expiry = kNever;
    if (left < 0 || right < 0) {
      winner = left < 0 ? right : left;
    } else if (error(right, x) > error(left, x)) {
      winner = right;
      expiry = certificate(right, left, x, xi);
    } else {
      winner = left;
      expiry = certificate(left, right, x, xi);
    }
    deadlines_.schedule(static_cast<std::uint32_t>(node), expiry);
    const bool changed = winner != winner_[node];
    winner_[node] = winner;
    return changed;
  }

  // First step at which `winner` might stop beating `loser` (see the class comment).
  std::int64_t certificate(std::int32_t winner, std::int32_t loser, double x, std::int64_t xi) const {
    const Line& w = lines_[static_cast<std::size_t>(winner)];
    const Line& v = lines_[static_cast<std::size_t>(loser)];
    if (w.weight == v.weight && w.count == v.count) return kNever;
    const double slope = (w.weight - v.weight) - certificate_slack_;
    const double count_gap = w.count - v.count;
    if (!(slope * x - count_gap > 0.0)) return xi + 1;
    if (slope >= 0.0) return kNever;
    const double until = count_gap / slope * (1.0 - 0x1p-40);
    if (!(until < 0x1p62)) return kNever;
    return std::max(static_cast<std::int64_t>(std::ceil(until)), xi + 1);
  }

  double error(std::int32_t d, double x) const {
    const Line& line = lines_[static_cast<std::size_t>(d)];
    return blend_error(line.weight, x, line.count);
  }

  // Weight and count side by side: a comparison touches one cache line per dataset.
  struct Line {
    double weight = 0.0;
    double count = 0.0;
  };
  const std::vector<std::uint64_t>* limits_;
  std::vector<Line> lines_;
  std::size_t leaves_ = 1;
  std::vector<std::int32_t> winner_;  // [1, leaves_) internal, [leaves_, 2·leaves_) datasets
  double certificate_slack_ = 0.0;
  DeadlineHeap deadlines_{0};
};

// Chooses the scan or the tournament; both give identical indices.
BlendIndices blend(const std::vector<double>& weights, const std::vector<std::uint64_t>* limits,
                   std::uint64_t size, const std::atomic<bool>* stop) {
  BlendIndices out;
  out.dataset_index = sized_array<std::int16_t>(size, str_cat("the blend's dataset index of ", size, " samples"));
  out.dataset_sample_index = sized_array<std::int64_t>(size, str_cat("the blend's sample index of ", size, " samples"));
  if (size == 0) return out;
  if (weights.size() <= kPlainScanMaxDatasets) {
    if (limits == nullptr) {
      blend_by_scanning<false>(weights, {}, stop, out);
    } else {
      blend_by_scanning<true>(weights, *limits, stop, out);
    }
  } else {
    TournamentBlender(weights, limits).run(stop, out);
  }
  return out;
}

std::string indent(const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out += "  " + line + "\n";
  return out;
}

}  // namespace

std::vector<std::pair<double, std::string>> parse_blend_spec(const std::string& spec) {
  std::vector<std::string> tokens;
  std::istringstream in(spec);
  for (std::string token; in >> token;) tokens.push_back(token);
  if (tokens.empty()) DUFU_FAIL("empty blend spec: expected \"PREFIX\" or \"WEIGHT PREFIX [WEIGHT PREFIX ...]\"");
  if (tokens.size() == 1) return {{1.0, tokens[0]}};
  if (tokens.size() % 2 != 0) {
    DUFU_FAIL("blend spec \"", spec, "\" has ", tokens.size(),
              " words; expected weight/prefix pairs like \"0.7 prefixA 0.3 prefixB\"");
  }
  if (tokens.size() / 2 > kMaxDatasets) {
    DUFU_FAIL("a blend takes at most ", kMaxDatasets, " datasets (int16 dataset ids); the spec has ",
              tokens.size() / 2);
  }
  std::vector<std::pair<double, std::string>> blend;
  for (std::size_t i = 0; i < tokens.size(); i += 2) {
    const std::string& text = tokens[i];
    const std::string& prefix = tokens[i + 1];
    // Python's float() (what Megatron uses) takes a leading '+'; from_chars does not.
    const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
    const char* end = text.data() + text.size();
    double weight = 0.0;
    const auto [stop, error] = std::from_chars(begin, end, weight, std::chars_format::general);
    if (error != std::errc() || stop != end || begin == end) {
      DUFU_FAIL("blend weight \"", text, "\" for ", prefix, " is not a number (spec \"", spec, "\")");
    }
    if (!std::isfinite(weight)) DUFU_FAIL("blend weights must be finite: got ", text, " for ", prefix);
    if (!(weight > 0.0)) DUFU_FAIL("blend weights must be positive: got ", text, " for ", prefix);
    blend.emplace_back(weight, prefix);
  }
  return blend;
}

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  check_blend_weights(weights);
  // numpy reduces onto its identity, 0.0, rather than onto the first element.
  const double sum = 0.0 + numpy_pairwise_sum(weights.data(), weights.size());
  std::vector<double> normalized(weights.size());
  for (std::size_t d = 0; d < weights.size(); ++d) normalized[d] = weights[d] / sum;
  return normalized;
}

std::vector<std::uint64_t> blend_dataset_sizes(const std::vector<double>& normalized_weights, std::uint64_t size) {
  check_blend_weights(normalized_weights);
  // Megatron: int(math.ceil(math.ceil(size * weight) * (1 + 0.5 / 100))).
  const double margin = 1.0 + 0.5 / 100.0;
  std::vector<std::uint64_t> sizes(normalized_weights.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const double needed = std::ceil(static_cast<double>(size) * normalized_weights[d]);
    const double with_margin = std::ceil(needed * margin);
    if (!(with_margin < 0x1p64)) DUFU_FAIL("blend dataset size overflows: size ", size, " weight ", normalized_weights[d]);
    sizes[d] = static_cast<std::uint64_t>(with_margin);
  }
  return sizes;
}

BlendIndices build_blend_indices(const std::vector<double>& normalized_weights, std::uint64_t size,
                                 const std::atomic<bool>* stop) {
  check_blend_weights(normalized_weights);
  check_blend_size(size);
  return blend(normalized_weights, nullptr, size, stop);
}

BlendIndices build_exhaustive_blend_indices(const std::vector<std::uint64_t>& sizes, const std::atomic<bool>* stop) {
  if (sizes.empty()) DUFU_FAIL("a blend needs at least one dataset");
  if (sizes.size() > kMaxDatasets) {
    DUFU_FAIL("a blend takes at most ", kMaxDatasets, " datasets (int16 dataset ids); got ", sizes.size());
  }
  std::uint64_t total = 0;
  for (std::uint64_t size : sizes) {
    check_blend_size(size);
    total += size;
    check_blend_size(total);
  }
  if (total == 0) return {};
  // Megatron: sizes[i] / static_cast<double>(total_size), sizes being int64.
  std::vector<double> weights(sizes.size());
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    weights[d] = static_cast<double>(static_cast<std::int64_t>(sizes[d])) / static_cast<double>(total);
  }
  // An empty dataset starts used up; Megatron would offer it (and never retire it).
  return blend(weights, &sizes, total, stop);
}

struct BlendedDataset::Arrays {
  BlendIndices memory;  // when not cached
  std::optional<NpyArray> dataset_index_file;
  std::optional<NpyArray> dataset_sample_index_file;
  std::span<const std::int16_t> dataset_index;
  std::span<const std::int64_t> dataset_sample_index;
};

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const TokenDataset>> datasets, std::vector<double> weights,
                               std::vector<std::string> cache_descriptions, BlendOptions options)
    : datasets_(std::move(datasets)), arrays_(std::make_unique<Arrays>()) {
  const std::size_t n = datasets_.size();
  if (n == 0) DUFU_FAIL("a blend needs at least one dataset");
  if (n > kMaxDatasets) DUFU_FAIL("a blend takes at most ", kMaxDatasets, " datasets (int16 dataset ids); got ", n);
  for (std::size_t d = 0; d < n; ++d) {
    if (datasets_[d] == nullptr) DUFU_FAIL("blend dataset ", d, " is null");
    if (datasets_[d]->sample_length() != datasets_[0]->sample_length()) {
      DUFU_FAIL("blended datasets must share sample_length (seq_length + 1): dataset ", d, " (",
                datasets_[d]->describe(), ") has ", datasets_[d]->sample_length(), " but dataset 0 (",
                datasets_[0]->describe(), ") has ", datasets_[0]->sample_length());
    }
  }
  if (!(weights.empty() && !options.size) && weights.size() != n) {
    DUFU_FAIL("a blend of ", n, " datasets got ", weights.size(), " weights");
  }
  for (std::size_t d = 0; d < weights.size(); ++d) {
    if (!std::isfinite(weights[d]) || !(weights[d] > 0.0)) {
      DUFU_FAIL("blend weights must be positive: got ", shortest(weights[d]), " for dataset ", d, " (",
                datasets_[d]->describe(), ")");
    }
  }
  if (options.use_cache && cache_descriptions.size() != n) {
    DUFU_FAIL("a cached blend needs one cache description per dataset: got ", cache_descriptions.size(), " for ",
              n, " datasets");
  }

  std::vector<std::uint64_t> sizes(n);
  for (std::size_t d = 0; d < n; ++d) sizes[d] = datasets_[d]->size();
  std::uint64_t blend_size = 0;
  if (options.size) {
    if (*options.size == 0) DUFU_FAIL("blend size must be positive");
    check_blend_size(*options.size);
    blend_size = *options.size;
    // Megatron's BlendedDataset normalizes the weights it is given, even when its
    // builder has normalized them already; doing the same keeps the bits equal.
    weights_ = normalize_weights(weights);
  } else {
    for (std::uint64_t size : sizes) blend_size += size;
    if (blend_size == 0) DUFU_FAIL("an exhaustive blend of empty datasets has no samples");
    check_blend_size(blend_size);
    weights_.resize(n);
    for (std::size_t d = 0; d < n; ++d) weights_[d] = static_cast<double>(sizes[d]) / static_cast<double>(blend_size);
  }
  auto build = [&] {
    // Only the construction can be stopped; the flag's owner need not outlive it.
    return options.size ? build_blend_indices(weights_, blend_size, options.stop)
                        : build_exhaustive_blend_indices(sizes, options.stop);
  };

  std::ostringstream description;
  description << "dufu blend index v" << kIndexCacheFormatVersion << "\n";
  description << "size: " << (options.size ? std::to_string(blend_size) : std::string("exhaustive")) << "\n";
  description << "weights:";
  for (double w : weights_) description << " " << format_double(w);
  description << "\ndatasets:\n";
  for (std::size_t d = 0; d < n; ++d) {
    description << "dataset " << d << ": " << sizes[d] << " samples\n";
    if (d < cache_descriptions.size()) description << indent(cache_descriptions[d]);
  }
  description_ = description.str();

  Arrays& arrays = *arrays_;
  if (options.use_cache) {
    const IndexCache cache(options.cache_dir.empty() ? default_index_cache_dir() : options.cache_dir);
    cache_path_ = cache.get_or_build(description_, [&](const std::string& temp_dir) {
      const BlendIndices built = build();
      write_npy<std::int16_t>(temp_dir + "/dataset_index.npy", built.dataset_index);
      write_npy<std::int64_t>(temp_dir + "/dataset_sample_index.npy", built.dataset_sample_index);
    });
    arrays.dataset_index_file.emplace(NpyArray::open(cache_path_ + "/dataset_index.npy"));
    arrays.dataset_sample_index_file.emplace(NpyArray::open(cache_path_ + "/dataset_sample_index.npy"));
    arrays.dataset_index = arrays.dataset_index_file->view<std::int16_t>();
    arrays.dataset_sample_index = arrays.dataset_sample_index_file->view<std::int64_t>();
    if (arrays.dataset_index.size() != blend_size || arrays.dataset_sample_index.size() != blend_size ||
        arrays.dataset_index_file->shape().size() != 1 || arrays.dataset_sample_index_file->shape().size() != 1) {
      DUFU_FAIL("blend cache ", cache_path_, " holds arrays of the wrong shape (expected ", blend_size,
                " samples); delete the directory to rebuild it");
    }
  } else {
    arrays.memory = build();
    arrays.dataset_index = arrays.memory.dataset_index;
    arrays.dataset_sample_index = arrays.memory.dataset_sample_index;
  }

  // What the blend draws from each dataset: the last time a dataset appears carries
  // its count, so a backward scan usually stops long before the start.
  std::vector<std::uint64_t> needed(n, 0);
  std::vector<std::uint8_t> seen(n, 0);
  std::size_t unseen = n;
  for (std::size_t i = blend_size; i-- > 0 && unseen > 0;) {
    const std::int16_t d = arrays.dataset_index[i];
    if (d < 0 || static_cast<std::size_t>(d) >= n) {
      DUFU_FAIL("blend index ", cache_path_, " names dataset ", d, " at sample ", i, " but the blend has ", n,
                " datasets; delete the directory to rebuild it");
    }
    if (seen[d]) continue;
    seen[d] = 1;
    --unseen;
    needed[d] = static_cast<std::uint64_t>(arrays.dataset_sample_index[i]) + 1;
  }
  for (std::size_t d = 0; d < n; ++d) {
    if (needed[d] <= sizes[d]) continue;
    const std::uint64_t suggested =
        std::max(needed[d], blend_dataset_sizes(weights_, blend_size)[d]);
    DUFU_FAIL("dataset ", d, " (", datasets_[d]->describe(), ") has ", sizes[d], " samples but the blend needs ",
              needed[d], "; build it with num_samples >= ", suggested, " (Megatron's ceil(ceil(size·w)·1.005))");
  }
}

BlendedDataset::~BlendedDataset() = default;

std::uint64_t BlendedDataset::size() const { return arrays_->dataset_index.size(); }

std::uint64_t BlendedDataset::sample_length() const { return datasets_[0]->sample_length(); }

std::pair<std::int16_t, std::int64_t> BlendedDataset::source_of(std::uint64_t index) const {
  if (index >= size()) DUFU_FAIL("blend sample ", index, " out of range: the blend has ", size(), " samples");
  return {arrays_->dataset_index[index], arrays_->dataset_sample_index[index]};
}

void BlendedDataset::get(std::uint64_t index, std::span<std::int32_t> out) const {
  const auto [d, sample] = source_of(index);
  // Only the tail of a cached index was checked on open; a damaged file must not
  // turn into an out-of-bounds read.
  if (d < 0 || static_cast<std::size_t>(d) >= datasets_.size() || sample < 0) {
    DUFU_FAIL("blend index ", cache_path_, " maps sample ", index, " to dataset ", d, " sample ", sample,
              "; delete the directory to rebuild it");
  }
  datasets_[d]->get(static_cast<std::uint64_t>(sample), out);
}

std::string BlendedDataset::describe() const {
  std::ostringstream out;
  out << "blend of " << datasets_.size() << " datasets, " << size() << " samples, weights";
  const std::size_t shown = std::min<std::size_t>(weights_.size(), 8);
  for (std::size_t d = 0; d < shown; ++d) out << (d == 0 ? " " : ", ") << weights_[d];
  if (shown < weights_.size()) out << ", ...";
  return out.str();
}

}  // namespace dufu::dataprep
