// Document boundaries and position ids of packed samples (packed_documents.h), against
// values worked out by hand from Megatron's _get_ltor_masks_and_position_ids: an
// end-of-document token closes its document, the next token opens one. (The Python
// package's test_documents.py compares whole loader batches with that function.)
#include "dufu/dataprep/packed_documents.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

constexpr std::int32_t kEod = 9;

TEST(PackedDocumentsTest, BoundariesAndPositionsOfTwoRows) {
  // Two samples of T + 1 = 7 tokens; only the first 6 of each are inputs.
  //   row 0 inputs: 5 9 | 4 4 9 | 7    (then target 9, ignored here)
  //   row 1 inputs: 9 | 3 3 3 3 9       (its last input is an EOD: opens nothing)
  const std::vector<std::int32_t> tokens = {5, 9, 4, 4, 9, 7, 9, 9, 3, 3, 3, 3, 9, 1};
  const PackedDocuments documents = find_packed_documents(tokens, 2, 7, kEod);
  EXPECT_EQ(documents.position_ids, (std::vector<std::int32_t>{0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 3, 4}));
  EXPECT_EQ(documents.cu_seqlens, (std::vector<std::int32_t>{0, 2, 5, 6, 7, 12}));
  EXPECT_EQ(document_starts_from_cu_seqlens(documents.cu_seqlens, 2, 6),
            (std::vector<std::int32_t>{0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 1, 1}));
}

TEST(PackedDocumentsTest, RowsWithoutEndOfDocumentAreOneDocument) {
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const PackedDocuments documents = find_packed_documents(tokens, 2, 4, kEod);
  EXPECT_EQ(documents.position_ids, (std::vector<std::int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(documents.cu_seqlens, (std::vector<std::int32_t>{0, 3, 6}));
  EXPECT_EQ(document_starts_from_cu_seqlens(documents.cu_seqlens, 2, 3), (std::vector<std::int32_t>(6, 0)));
}

TEST(PackedDocumentsTest, MalformedInputsAreRefused) {
  EXPECT_ANY_THROW(find_packed_documents(std::vector<std::int32_t>(5), 2, 3, kEod));  // 5 tokens for 2 x 3: a bug
  const std::vector<std::int32_t> crossing = {0, 2, 4, 6};  // a document over the edge of rows of 3
  EXPECT_THROW(document_starts_from_cu_seqlens(crossing, 2, 3), Error);
  const std::vector<std::int32_t> short_total = {0, 3, 5};
  EXPECT_THROW(document_starts_from_cu_seqlens(short_total, 2, 3), Error);
}

}  // namespace
}  // namespace dufu::dataprep
