// model.init_from at another model.seq_length (see init_from_length.h).
#include "init_from_length.h"

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>

#include "dufu/common/error.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/model/gpt_layout.h"

namespace dufu::trainer {

void refuse_positions_beyond_checkpoint(const GPTConfig& saved, const GPTConfig& run, const std::string& checkpoint) {
  if (run.is_llama() || run.seq_length <= saved.seq_length) return;
  DUFU_FAIL("model.init_from ", checkpoint, ": model.seq_length = ", run.seq_length, " is longer than the ",
            saved.seq_length, " positions of the checkpoint's learned position table (wpe); HINT: set "
            "model.seq_length=", saved.seq_length, " or less (a shorter run uses the table's first rows)");
}

std::vector<float> weights_at_seq_length(const std::string& checkpoint, const GPTConfig& saved, const GPTConfig& run) {
  GPT source(saved);  // the whole model on the CPU device, as a resharded load assembles it
  load_checkpoint(checkpoint, source, nullptr);
  const std::span<const float> from = std::as_const(source).params();
  const std::vector<ParamTensor> from_layout = gpt_parameter_layout(saved);
  const std::vector<ParamTensor> to_layout = gpt_parameter_layout(run);
  DUFU_CHECK(from_layout.size() == to_layout.size(), "init_from: ", from_layout.size(), " tensors at seq_length ",
             saved.seq_length, ", ", to_layout.size(), " at ", run.seq_length);
  std::vector<float> weights(gpt_layout_size(to_layout), 0.0f);
  for (std::size_t i = 0; i < to_layout.size(); ++i) {
    const ParamTensor& to = to_layout[i];
    const ParamTensor& was = from_layout[i];
    DUFU_CHECK(to.name == was.name && to.size() <= was.size(), "init_from: tensor ", to.name, " (", to.size(),
               " floats) from ", was.name, " (", was.size(), ")");
    // Row-major: a shorter wpe's rows are the first ones; every other tensor is whole.
    std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(was.offset), to.size(),
                weights.begin() + static_cast<std::ptrdiff_t>(to.offset));
  }
  return weights;
}

}  // namespace dufu::trainer
