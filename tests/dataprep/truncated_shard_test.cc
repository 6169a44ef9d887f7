// A .bin cut shorter while a dataset over it is open (an in-place rewrite, a full disk
// on a copy): every read raises dufu::Error naming the file, in every impl. Unchecked,
// reading the mmap impl's mapping past the file's new end kills the process with
// SIGBUS, and the cached impl serves bytes the shard no longer has.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;

TEST(TruncatedShardTest, EveryReadOfEveryImplRaises) {
  for (const IndexImpl impl : {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached}) {
    SCOPED_TRACE(std::string(impl_name(impl)));
    dufu::testing::TempDir dir;
    const std::string prefix = dir.file("shard");
    IndexedDatasetWriter writer(prefix, layout_for_impl(impl), DType::kInt32);
    for (int document = 0; document < 4; ++document) writer.add_document(std::vector<std::int32_t>(5000, document));
    writer.commit();
    const auto dataset = IndexedDataset::open(prefix, impl);
    EXPECT_EQ(dataset->sequence(3).front(), 3);

    ASSERT_EQ(::truncate(bin_path(prefix).c_str(), static_cast<off_t>(dataset->bin_size() / 2)), 0);
    for (const std::uint64_t sequence : {0, 3}) {
      expect_error([&] { dataset->sequence(sequence); },
                   {bin_path(prefix), "was truncated while open", "HINT"});
    }
    std::vector<std::byte> bytes(4);
    expect_error([&] { dataset->read_bytes(0, bytes.size(), bytes.data()); }, {bin_path(prefix), "truncated"});
  }
}

// Watching for truncation keeps each shard's descriptor open, so a blend of more
// shards than the soft limit on open files (often 1024; 64 here) must still open: the
// first dataset raises the soft limit to the hard one. In a child process, whose
// limits the other tests do not share.
TEST(TruncatedShardTest, MoreShardsThanTheSoftLimitOnOpenFilesOpenInEveryImpl) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  constexpr int kShards = 150;
  if (limit.rlim_max < 4 * kShards) GTEST_SKIP() << "the hard limit on open files is " << limit.rlim_max;
  for (const IndexImpl impl : {IndexImpl::kMmap, IndexImpl::kLazy, IndexImpl::kCached}) {
    SCOPED_TRACE(std::string(impl_name(impl)));
    dufu::testing::TempDir dir;
    const auto prefix = [&](int shard) { return dir.file("shard-" + std::to_string(shard)); };
    IndexedDatasetWriter writer(prefix(0), layout_for_impl(impl), DType::kInt32);
    writer.add_document(std::vector<std::int32_t>{7, 8, 9});
    writer.commit();
    for (int shard = 1; shard < kShards; ++shard) {
      std::filesystem::copy_file(bin_path(prefix(0)), bin_path(prefix(shard)));
      std::filesystem::copy_file(idx_path(prefix(0)), idx_path(prefix(shard)));
    }
    EXPECT_EXIT(
        {
          rlimit low = limit;
          low.rlim_cur = 64;
          if (::setrlimit(RLIMIT_NOFILE, &low) != 0) std::_Exit(2);
          std::vector<std::unique_ptr<IndexedDataset>> datasets;
          for (int shard = 0; shard < kShards; ++shard) {
            datasets.push_back(IndexedDataset::open(prefix(shard), impl));
          }
          for (const auto& dataset : datasets) {
            if (dataset->sequence(0).back() != 9) std::_Exit(3);
          }
          std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "");
  }
}

}  // namespace
}  // namespace dufu::dataprep
