// What the import_hf unit tests share (hf_import_unit_test.cc for GPT2LMHeadModel,
// hf_import_llama_unit_test.cc for LlamaForCausalLM): the values their hand-made
// tensors hold, writing them as transformers saves them (one file, or shards with an
// index), reading back what a checkpoint loads, and a refused import that must name its
// cause and leave nothing behind.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/hf_import.h"
#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

namespace dufu::trainer::hf_import_testing {

// Element `element` of the `tensor`-th tensor: multiples of 1/16 in [-2, 2), exact in
// F32, BF16 and F16 alike.
inline float value_of(std::size_t tensor, std::size_t element) {
  return static_cast<float>(static_cast<int>((tensor * 37 + element * 11) % 64)) / 16.0f - 2.0f;
}

// The `tensor`-th tensor's values for a tensor of `shape`.
inline std::vector<float> values_of(std::size_t tensor, const std::vector<std::uint64_t>& shape) {
  std::uint64_t count = 1;
  for (const std::uint64_t d : shape) count *= d;
  std::vector<float> values(count);
  for (std::size_t j = 0; j < count; ++j) values[j] = value_of(tensor, j);
  return values;
}

// The F16 bits of a value_of: normal numbers and zero only.
inline std::uint16_t to_half(float value) {
  if (value == 0.0f) return 0;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15;
  return static_cast<std::uint16_t>(((bits >> 16) & 0x8000) | (exponent << 10) | ((bits >> 13) & 0x3ff));
}

// The name transformers gives file f of `files` weight files.
inline std::string weight_file_name(int f, int files) {
  return files == 1 ? std::string("model.safetensors")
                    : "model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(files) + ".safetensors";
}

// The weight files of a hand-made HF directory, as transformers saves them: tensors
// added to files in turn (or to a chosen one), each stored as F32, BF16 (its upper
// half, exact for value_of's values) or F16 (to_half), then written as model.safetensors
// or as shards with model.safetensors.index.json. An F32 tensor's values are not
// copied: they must outlive write().
class HfWeightFiles {
 public:
  explicit HfWeightFiles(int files) : refs_(static_cast<std::size_t>(files)) {}

  // To the next file in turn.
  void add(const std::string& name, const std::vector<std::uint64_t>& shape, const std::vector<float>& values,
           safetensors::Dtype dtype) {
    add_to(static_cast<int>(added_++ % refs_.size()), name, shape, values, dtype);
  }

  void add_to(int file, const std::string& name, const std::vector<std::uint64_t>& shape,
              const std::vector<float>& values, safetensors::Dtype dtype) {
    const void* data = values.data();
    if (dtype != safetensors::Dtype::kF32) {
      std::vector<std::uint16_t>& bits = halves_.emplace_back();
      for (const float v : values) {
        bits.push_back(dtype == safetensors::Dtype::kF16
                           ? to_half(v)
                           : static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16));
      }
      data = bits.data();
    }
    refs_[static_cast<std::size_t>(file)].push_back({name, dtype, shape, data});
  }

  void write(const std::string& dir) const {
    const int files = static_cast<int>(refs_.size());
    std::map<std::string, std::string> weight_map;
    for (int f = 0; f < files; ++f) {
      const std::vector<safetensors::TensorRef>& refs = refs_[static_cast<std::size_t>(f)];
      for (const safetensors::TensorRef& ref : refs) weight_map[ref.name] = weight_file_name(f, files);
      safetensors::write(dir + "/" + weight_file_name(f, files), refs);
    }
    if (files == 1) return;
    std::ofstream index(dir + "/model.safetensors.index.json");
    index << "{\"metadata\": {}, \"weight_map\": {";
    bool first = true;
    for (const auto& [name, file] : weight_map) {
      index << (first ? "" : ", ") << '"' << name << "\": \"" << file << '"';
      first = false;
    }
    index << "}}";
  }

 private:
  std::vector<std::vector<safetensors::TensorRef>> refs_;
  std::deque<std::vector<std::uint16_t>> halves_;  // a deque: the refs point into its vectors
  std::size_t added_ = 0;
};

// Imports `hf` into `out` in tp x pp pieces, padding the vocabulary to a multiple of
// `vocab_multiple`; fails the test unless the checkpoint's state says step 0 and that
// layout.
inline HfImport import_in_layout(const std::string& hf, const std::string& out, int tp, int pp, int vocab_multiple) {
  HfImportOptions options;
  options.tensor_parallel_size = tp;
  options.pipeline_parallel_size = pp;
  options.vocab_multiple = vocab_multiple;
  HfImport imported = import_hf(hf, out, options);
  const TrainingState state = read_checkpoint_state(out);
  EXPECT_EQ(state.step, 0);
  EXPECT_EQ(state.layout.tensor_parallel_size, tp);
  EXPECT_EQ(state.layout.pipeline_parallel_size, pp);
  return imported;
}

// The parameters a model of `config` holds after loading `checkpoint`.
inline std::vector<float> loaded_params(const std::string& checkpoint, const GPTConfig& config) {
  GPT model(config);
  load_checkpoint(checkpoint, model, nullptr);
  return std::vector<float>(model.params().begin(), model.params().end());
}

// Imports `hf` into `out` (inside `temp`) with `vocab_multiple`: fails the test unless
// the import throws an error holding every needle and leaves neither `out` nor a
// partial directory behind.
inline void expect_refused(const dufu::testing::TempDir& temp, const std::string& hf, const std::string& out,
                           int vocab_multiple, const std::vector<std::string>& needles) {
  HfImportOptions options;
  options.vocab_multiple = vocab_multiple;
  dufu::testing::expect_error([&] { import_hf(hf, out, options); }, needles);
  EXPECT_FALSE(std::filesystem::exists(out));
  const std::string partial = std::filesystem::path(out).filename().string() + ".partial";
  for (const auto& entry : std::filesystem::directory_iterator(temp.path())) {
    EXPECT_EQ(entry.path().filename().string().find(partial), std::string::npos);
  }
}

}  // namespace dufu::trainer::hf_import_testing
