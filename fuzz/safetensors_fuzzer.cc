// The safetensors reader (the trainer's checkpoints, HuggingFace's files): the header
// length, the JSON header with its metadata and tensor entries, dtypes, shapes and
// data offsets. A file that opens must list its tensors sorted and unique, each with
// product(shape) x dtype size bytes, together covering exactly the data after the
// header; and written back through safetensors::write it must open to the same
// tensors and metadata.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/safetensors.h"
#include "fuzz_input.h"

namespace {

namespace st = dufu::trainer::safetensors;
using dufu::fuzz::fuzz_require;

struct Tensor {
  std::string name;
  st::Dtype dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> bytes;
  bool operator==(const Tensor&) const = default;
};

std::vector<Tensor> tensors_of(const st::File& file) {
  std::vector<Tensor> tensors;
  for (const st::TensorView& view : file.tensors()) {
    std::uint64_t elements = 1;
    for (const std::uint64_t dim : view.shape) elements *= dim;
    fuzz_require(view.bytes.size() == elements * st::dtype_size(view.dtype), "a tensor's size is not its shape's");
    fuzz_require(tensors.empty() || tensors.back().name < view.name, "tensors are not sorted and unique");
    fuzz_require(file.find(view.name) == &view, "find does not find a listed tensor");
    Tensor tensor{view.name, view.dtype, view.shape, std::vector<std::byte>(view.bytes.size())};
    if (!view.bytes.empty()) std::memcpy(tensor.bytes.data(), view.bytes.data(), view.bytes.size());
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::string path = write_input("model.safetensors", data, size);
  std::optional<st::File> file;
  if (!refused_cleanly_or_parsed([&] { file.emplace(st::File::open(path)); })) return 0;
  fuzz_require(size >= 8, "a file shorter than the header length opened");
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, data, 8);
  const std::vector<Tensor> tensors = tensors_of(*file);
  std::uint64_t data_bytes = 0;
  for (const Tensor& tensor : tensors) data_bytes += tensor.bytes.size();
  fuzz_require(header_length <= size - 8 && data_bytes == size - 8 - header_length,
               "the tensors do not cover the data section exactly");
  // A typed view of a tensor of another dtype is refused.
  for (const Tensor& tensor : tensors) {
    const bool viewed = refused_cleanly_or_parsed([&] { (void)file->view<float>(tensor.name); });
    fuzz_require(!viewed || tensor.dtype == st::Dtype::kF32, "a tensor was viewed as another dtype");
  }

  std::vector<st::TensorRef> refs;
  for (const Tensor& tensor : tensors) refs.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes.data()});
  const std::string copy_path = scratch_dir() + "/copy.safetensors";
  st::write(copy_path, refs, file->metadata());
  const st::File copy = st::File::open(copy_path);
  fuzz_require(copy.metadata() == file->metadata(), "the copy has other metadata");
  fuzz_require(tensors_of(copy) == tensors, "the copy has other tensors");
  return 0;
}
