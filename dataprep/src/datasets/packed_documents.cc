// Document boundaries and position ids of packed samples (packed_documents.h).
#include "dufu/dataprep/packed_documents.h"

#include <cstddef>
#include <cstdint>
#include <limits>

#include "dufu/common/error.h"

namespace dufu::dataprep {

void find_packed_documents(std::span<const std::int32_t> inputs, std::int32_t eod_id, std::int32_t row_offset,
                           std::span<std::int32_t> positions, std::vector<std::int32_t>& cu_seqlens) {
  DUFU_CHECK(positions.size() == inputs.size(), "find_packed_documents: ", positions.size(), " positions for ",
             inputs.size(), " tokens");
  cu_seqlens.push_back(row_offset);
  std::int32_t document_start = 0;
  const auto length = static_cast<std::int32_t>(inputs.size());
  for (std::int32_t t = 0; t < length; ++t) {
    positions[static_cast<std::size_t>(t)] = t - document_start;
    // An end-of-document token as the row's last input starts nothing in this row.
    if (inputs[static_cast<std::size_t>(t)] == eod_id && t + 1 < length) {
      document_start = t + 1;
      cu_seqlens.push_back(row_offset + document_start);
    }
  }
}

PackedDocuments find_packed_documents(std::span<const std::int32_t> tokens, std::uint64_t rows,
                                      std::uint64_t columns, std::int32_t eod_id) {
  DUFU_CHECK(columns >= 2 && tokens.size() == rows * columns, "find_packed_documents: ", tokens.size(),
             " tokens for a batch of ", rows, " x ", columns);
  const std::uint64_t T = columns - 1;
  if (rows * T > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    DUFU_FAIL("document masking: a batch of ", rows, " x ", T,
              " input tokens does not fit cu_seqlens' int32 offsets; HINT: a smaller micro-batch");
  }
  PackedDocuments out;
  out.position_ids.resize(rows * T);
  out.cu_seqlens.reserve(rows + 1);
  for (std::uint64_t row = 0; row < rows; ++row) {
    find_packed_documents(tokens.subspan(row * columns, T), eod_id, static_cast<std::int32_t>(row * T),
                          std::span<std::int32_t>(out.position_ids).subspan(row * T, T), out.cu_seqlens);
  }
  out.cu_seqlens.push_back(static_cast<std::int32_t>(rows * T));
  return out;
}

std::vector<std::int32_t> document_starts_from_cu_seqlens(std::span<const std::int32_t> cu_seqlens, std::uint64_t rows,
                                                          std::uint64_t T) {
  const std::uint64_t total = rows * T;
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || static_cast<std::uint64_t>(cu_seqlens.back()) != total) {
    DUFU_FAIL("document boundaries (cu_seqlens) must run from 0 to ", total, " for a batch of ", rows, " x ", T);
  }
  std::vector<std::int32_t> starts(total);
  for (std::size_t document = 0; document + 1 < cu_seqlens.size(); ++document) {
    const auto begin = static_cast<std::uint64_t>(cu_seqlens[document]);
    const auto end = static_cast<std::uint64_t>(cu_seqlens[document + 1]);
    if (begin >= end || end > total || begin / T != (end - 1) / T) {
      DUFU_FAIL("document boundaries (cu_seqlens): document ", document, " [", begin, ", ", end,
                ") is empty or crosses the edge of a row of ", T);
    }
    const auto row_start = static_cast<std::int32_t>(begin % T);
    for (std::uint64_t i = begin; i < end; ++i) starts[i] = row_start;
  }
  return starts;
}

}  // namespace dufu::dataprep
