// dist.zero_stage at a data-parallel size, and what it shards there: the one place
// that says so, asked by the data-parallel optimizer, the memory plan and `train
// plan`. Over one data-parallel rank nothing is sharded, whatever the stage.
#pragma once

#include "dufu/common/error.h"

namespace dufu::trainer {

class ZeroStage {
 public:
  ZeroStage(int stage, int data_parallel_size) : stage_(stage), data_parallel_size_(data_parallel_size) {
    DUFU_CHECK(stage >= 0 && stage <= 3, "ZeRO stage ", stage, "; stages 0 to 3 exist");
    DUFU_CHECK(data_parallel_size >= 1, "ZeRO over ", data_parallel_size, " data-parallel ranks");
  }

  int stage() const { return stage_; }
  int data_parallel_size() const { return data_parallel_size_; }
  // Stages 1 to 3: the AdamW moments, and the reduced gradient each rank updates from.
  bool shards_optimizer_state() const { return stage_ >= 1 && data_parallel_size_ > 1; }
  // Stages 2 and 3: each layer's gradient reduce-scattered as the backward makes it.
  bool shards_gradients() const { return stage_ >= 2 && data_parallel_size_ > 1; }
  // Stage 3: the parameters, each layer gathered before its use.
  bool shards_parameters() const { return stage_ == 3 && data_parallel_size_ > 1; }

 private:
  int stage_;
  int data_parallel_size_;
};

}  // namespace dufu::trainer
