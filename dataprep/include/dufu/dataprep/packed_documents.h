// Documents packed into causal-LM samples (document masking). A sample concatenates
// documents, each ended by the end-of-document token, so without help every token
// attends to the tail of the unrelated document before it and its position counts on
// from there. Megatron's GPT dataset answers with three switches, computed by
// _get_ltor_masks_and_position_ids (megatron/core/datasets/gpt_dataset.py) from a
// sample's input tokens (its first seq_length tokens) alone:
//   reset_position_ids   positions restart at 0 after each end-of-document token;
//   reset_attention_mask a token after an end-of-document token at i attends to
//                        nothing in [0, i]: documents see only themselves;
//   eod_mask_loss        no loss where the input token is the end-of-document token.
// The end-of-document token belongs to the document it ends. This file finds the
// first two as the document boundaries (flash-attention's cu_seqlens: where each
// document starts in the batch's flattened inputs, then the total) and the position
// ids; the loss mask is the test `input == eod` itself.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dufu::dataprep {

// One row: writes the position of each of `inputs`' tokens in its document into
// `positions` (inputs.size() entries) and appends the start of each of its documents,
// plus `row_offset`, to `cu_seqlens` (the first is row_offset itself: a row always
// starts a document, as the mask cannot see the previous row).
void find_packed_documents(std::span<const std::int32_t> inputs, std::int32_t eod_id, std::int32_t row_offset,
                           std::span<std::int32_t> positions, std::vector<std::int32_t>& cu_seqlens);

// A batch of `rows` samples of `columns` tokens (seq_length + 1: inputs then the last
// target): the position ids [rows, columns - 1] and the cu_seqlens of all rows' inputs
// flattened, ending with rows * (columns - 1). Throws dufu::Error when that total does
// not fit cu_seqlens' int32 (flash-attention's type).
struct PackedDocuments {
  std::vector<std::int32_t> position_ids;
  std::vector<std::int32_t> cu_seqlens;
};
PackedDocuments find_packed_documents(std::span<const std::int32_t> tokens, std::uint64_t rows,
                                      std::uint64_t columns, std::int32_t eod_id);

// Where each input token's document starts in its row ([rows, T]; T = the row length),
// from cu_seqlens as find_packed_documents makes them: the form attention kernels read.
std::vector<std::int32_t> document_starts_from_cu_seqlens(std::span<const std::int32_t> cu_seqlens, std::uint64_t rows,
                                                          std::uint64_t T);

}  // namespace dufu::dataprep
