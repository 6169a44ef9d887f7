// GPT::tensor_views, the walk of the layout that names every tensor of a buffer: a
// template (the parameters, gradients and moments are floats, the bf16 working copy
// bits), included by the files that make views.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "dufu/common/error.h"
#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

template <typename T, typename TensorOf>
BasicGPTTensors<T> GPT::tensor_views(TensorOf&& tensor_of) const {
  // Walks the layout in the order gpt_parameter_layout wrote it; the name check keeps
  // the two in step if either changes.
  std::size_t index = 0;
  const auto next = [&](std::string_view expected) {
    const ParamTensor& tensor = layout_[index++];
    DUFU_CHECK(tensor.name == expected, "layout has ", tensor.name, " where ", expected, " was expected");
    return tensor_of(tensor);
  };
  // Llama's q, k, v (and gate, up) are separate tensors that follow each other in the
  // buffer, so one pointer to the first is the fused matrix the matmul reads.
  const auto fused = [&](std::initializer_list<std::string_view> parts) {
    const ParamTensor& first = layout_[index];
    T* pointer = next(*parts.begin());
    std::size_t end = first.offset + first.size();
    for (auto part = parts.begin() + 1; part != parts.end(); ++part) {
      DUFU_CHECK(layout_[index].offset == end, layout_[index].name, " does not follow ", first.name);
      end += layout_[index].size();
      next(*part);
    }
    return pointer;
  };
  const bool llama = config_.is_llama();
  BasicGPTTensors<T> views{};
  views.wte = stage_.holds_wte() ? next("wte.weight") : nullptr;
  views.wpe = stage_.is_first() && !llama ? next("wpe.weight") : nullptr;
  views.h.resize(static_cast<std::size_t>(stage_.num_layers));
  for (int local = 0; local < stage_.num_layers; ++local) {
    const std::string prefix = str_cat("h.", stage_.first_layer + local, ".");
    BasicGPTLayerTensors<T>& h = views.h[static_cast<std::size_t>(local)];
    if (llama) {
      h.ln_1_weight = next(prefix + "ln_1.weight");
      h.attn_c_attn_weight =
          fused({prefix + "attn.q_proj.weight", prefix + "attn.k_proj.weight", prefix + "attn.v_proj.weight"});
      h.attn_c_proj_weight = next(prefix + "attn.o_proj.weight");
      h.ln_2_weight = next(prefix + "ln_2.weight");
      h.mlp_c_fc_weight = fused({prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"});
      h.mlp_c_proj_weight = next(prefix + "mlp.down_proj.weight");
      continue;
    }
    h.ln_1_weight = next(prefix + "ln_1.weight");
    h.ln_1_bias = next(prefix + "ln_1.bias");
    h.attn_c_attn_weight = next(prefix + "attn.c_attn.weight");
    h.attn_c_attn_bias = next(prefix + "attn.c_attn.bias");
    h.attn_c_proj_weight = next(prefix + "attn.c_proj.weight");
    h.attn_c_proj_bias = next(prefix + "attn.c_proj.bias");
    h.ln_2_weight = next(prefix + "ln_2.weight");
    h.ln_2_bias = next(prefix + "ln_2.bias");
    h.mlp_c_fc_weight = next(prefix + "mlp.c_fc.weight");
    h.mlp_c_fc_bias = next(prefix + "mlp.c_fc.bias");
    h.mlp_c_proj_weight = next(prefix + "mlp.c_proj.weight");
    h.mlp_c_proj_bias = next(prefix + "mlp.c_proj.bias");
  }
  views.ln_f_weight = stage_.is_last() ? next("ln_f.weight") : nullptr;
  views.ln_f_bias = stage_.is_last() && !llama ? next("ln_f.bias") : nullptr;
  views.lm_head = stage_.is_last() && !config_.tie_embeddings ? next("lm_head.weight") : nullptr;
  DUFU_CHECK(index == layout_.size());
  return views;
}

}  // namespace dufu::trainer
