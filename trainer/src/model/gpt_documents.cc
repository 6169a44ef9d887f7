// The documents packed into a batch's rows (BatchDocuments, gpt.h): checked on the
// host once, then uploaded into the activation slot, whose backward reads them again.
#include <cstddef>
#include <cstdint>

#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

void GPT::check_documents(const BatchDocuments& documents, int B, int T) const {
  const std::size_t rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
  if (!documents.positions.empty()) {
    if (documents.positions.size() != rows) {
      DUFU_FAIL("GPT::forward: ", documents.positions.size(), " position ids for a batch of ", B, " x ", T);
    }
    for (std::size_t i = 0; i < rows; ++i) {
      const std::int32_t position = documents.positions[i];
      if (position < 0 || position >= config_.seq_length) {
        DUFU_FAIL("GPT::forward: position id ", position, " at position ", i, " is outside [0, ", config_.seq_length,
                  ")");
      }
    }
  }
  if (documents.document_starts.empty()) return;
  if (documents.document_starts.size() != rows) {
    DUFU_FAIL("GPT::forward: ", documents.document_starts.size(), " document starts for a batch of ", B, " x ", T);
  }
  // The kernels read a row's first start as the earliest any of its tokens sees, and
  // each start as a key range ending at its own token.
  for (int b = 0; b < B; ++b) {
    std::int32_t previous = 0;
    for (int t = 0; t < T; ++t) {
      const std::int32_t start = documents.document_starts[static_cast<std::size_t>(b) * T + t];
      const bool continues = t > 0 && start == previous;
      if (!continues && start != t) {
        DUFU_FAIL("GPT::forward: row ", b, " position ", t, " starts its document at ", start,
                  ", which is not a packing (a token continues the document before it or starts one itself)");
      }
      previous = start;
    }
  }
}

void GPT::upload_documents(ActivationSlot& slot, const BatchDocuments& documents) {
  const std::size_t capacity = static_cast<std::size_t>(slot.capacity_b) * static_cast<std::size_t>(slot.capacity_t);
  const auto upload = [&](DeviceBuffer<std::int32_t>& buffer, std::span<const std::int32_t> values) {
    if (values.empty()) return false;
    if (buffer.size() < capacity) buffer = DeviceBuffer<std::int32_t>(*device_, capacity);
    buffer.upload(values);
    return true;
  };
  slot.has_positions = upload(slot.positions, documents.positions);
  slot.has_document_starts = upload(slot.document_starts, documents.document_starts);
}

}  // namespace dufu::trainer
