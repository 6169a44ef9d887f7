// A .bin cut shorter while a dataset over it is open (an in-place rewrite, a full disk
// on a copy): every read raises dufu::Error naming the file, in every impl. Reading
// the mmap impl's mapping past the file's new end used to kill the process with
// SIGBUS; the cached impl served bytes the shard no longer had.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/indexed_dataset.h"
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

}  // namespace
}  // namespace dufu::dataprep
