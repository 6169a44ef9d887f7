// Shard statistics for `dataprep inspect`, from the index alone (no token reads), so
// inspecting a multi-terabyte shard takes as long as reading its index.
#include "dufu/dataprep/inspect.h"

#include <algorithm>
#include <cstdio>
#include <sys/stat.h>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::dataprep {

ShardSummary summarize(const IndexedDataset& dataset) {
  const Index& index = dataset.index();
  ShardSummary summary;
  summary.prefix = dataset.prefix();
  summary.layout = index.layout();
  summary.dtype = index.dtype();
  summary.version = index.version();
  summary.sequences = index.num_sequences();
  summary.documents = index.num_documents();
  summary.tokens = index.total_tokens();
  summary.idx_bytes = index.file_size();
  summary.bin_bytes = dataset.bin_size();
  if (summary.sequences == 0) return summary;

  std::vector<std::uint32_t> lengths(summary.sequences);
  for (std::uint64_t i = 0; i < summary.sequences; ++i) {
    lengths[i] = static_cast<std::uint32_t>(index.sequence_length(i));
  }
  const auto [min_it, max_it] = std::minmax_element(lengths.begin(), lengths.end());
  summary.min_length = *min_it;
  summary.max_length = *max_it;
  summary.mean_length = static_cast<double>(summary.tokens) / static_cast<double>(summary.sequences);
  auto at_fraction = [&](double fraction) {
    const auto rank = static_cast<std::size_t>(fraction * static_cast<double>(lengths.size() - 1));
    std::nth_element(lengths.begin(), lengths.begin() + static_cast<std::ptrdiff_t>(rank), lengths.end());
    return static_cast<std::uint64_t>(lengths[rank]);
  };
  summary.median_length = at_fraction(0.5);
  summary.p99_length = at_fraction(0.99);
  return summary;
}

std::string format_summary(const ShardSummary& s) {
  char line[512];
  std::string out;
  auto add = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof(line), "%-18s %s\n", name, value.c_str());
    out += line;
  };
  add("prefix", s.prefix);
  add("layout", std::string(layout_name(s.layout)));
  add("version", std::to_string(s.version));
  add("dtype", str_cat(dtype_name(s.dtype), " (", dtype_size(s.dtype), " bytes)"));
  add("sequences", std::to_string(s.sequences));
  add("documents", std::to_string(s.documents));
  add("tokens", std::to_string(s.tokens));
  if (s.sequences > 0) {
    std::snprintf(line, sizeof(line), "min %llu, median %llu, mean %.1f, p99 %llu, max %llu",
                  static_cast<unsigned long long>(s.min_length),
                  static_cast<unsigned long long>(s.median_length), s.mean_length,
                  static_cast<unsigned long long>(s.p99_length),
                  static_cast<unsigned long long>(s.max_length));
    add("sequence length", line);
  }
  add("idx bytes", std::to_string(s.idx_bytes));
  add("bin bytes", std::to_string(s.bin_bytes));
  return out;
}

}  // namespace dufu::dataprep
