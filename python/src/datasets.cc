// dufu.TokenDataset and its kinds: the causal-LM dataset over one shard (Megatron's
// split, document/sample/shuffle indices, cached as .npy under the same keys the C++
// tools use), the weighted blend, and build_blend, the exact path of `dataprep
// build-index`, `dataprep sample` and the trainer. Index building runs without the GIL,
// on a thread of its own that Ctrl-C stops (interruptible.h).
#include <pybind11/stl.h>

#include <atomic>
#include <optional>
#include <variant>
#include <vector>

#include "bindings.h"
#include "interruptible.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/blend_builder.h"
#include "dufu/dataprep/blended_dataset.h"
#include "dufu/dataprep/causal_lm_dataset.h"
#include "dufu/dataprep/token_dataset.h"

namespace dufu::python {
namespace {

using dataprep::BlendedDataset;
using dataprep::CausalLMDataset;
using dataprep::TokenDataset;

// "train" | "valid" | "test" -> Megatron's part number (as `--split-part`).
int split_part_number(const std::string& part) {
  if (part == "train") return 0;
  if (part == "valid") return 1;
  if (part == "test") return 2;
  DUFU_FAIL("unknown split part '", part, "': use train, valid or test");
}

// Megatron's split string and part, or (with split None) OSLO's [start, end) fractions.
dataprep::SplitSpec make_split(const std::optional<std::string>& split, const std::string& part,
                               std::pair<double, double> fractions) {
  dataprep::SplitSpec spec;
  spec.megatron_split = split;
  spec.megatron_part = split_part_number(part);
  spec.start_weight = fractions.first;
  spec.end_weight = fractions.second;
  return spec;
}

py::array_t<std::int32_t> sample(const TokenDataset& dataset, const py::object& index) {
  const std::uint64_t position = python_index(index, dataset.size(), "sample");
  py::array_t<std::int32_t> out(static_cast<py::ssize_t>(dataset.sample_length()));
  std::span<std::int32_t> tokens(out.mutable_data(), dataset.sample_length());
  {
    py::gil_scoped_release release;
    dataset.get(position, tokens);
  }
  return out;
}

// Samples `indices` as one [len(indices), sample_length] int32 array.
py::array_t<std::int32_t> samples(const TokenDataset& dataset, const py::iterable& indices) {
  std::vector<std::uint64_t> positions;
  for (const py::handle index : indices) positions.push_back(python_index(index, dataset.size(), "sample"));
  const std::uint64_t columns = dataset.sample_length();
  py::array_t<std::int32_t> out({static_cast<py::ssize_t>(positions.size()), static_cast<py::ssize_t>(columns)});
  std::int32_t* data = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (std::size_t row = 0; row < positions.size(); ++row) {
      dataset.get(positions[row], std::span<std::int32_t>(data + row * columns, columns));
    }
  }
  return out;
}

std::shared_ptr<CausalLMDataset> make_causal_lm(const py::handle& shard, std::uint64_t seq_length,
                                                std::optional<std::uint64_t> num_samples, std::uint32_t seed,
                                                std::optional<std::string> split, const std::string& split_part,
                                                std::pair<double, double> split_range, const std::string& cache_dir,
                                                bool use_cache) {
  dataprep::CausalLMOptions options;
  options.seq_length = seq_length;
  options.num_samples = num_samples;
  options.seed = seed;
  options.split = make_split(split, split_part, split_range);
  options.cache_dir = cache_dir;
  options.use_cache = use_cache;
  auto dataset = shard_dataset(shard);
  std::atomic<bool> stop{false};
  options.stop = &stop;
  return run_interruptibly(stop, [&dataset, &options] {
    return std::make_shared<CausalLMDataset>(std::move(dataset), std::move(options));
  });
}

py::array_t<std::int32_t> document_index(const CausalLMDataset& dataset) {
  py::array_t<std::int32_t> out(static_cast<py::ssize_t>(dataset.document_index_size()));
  std::int32_t* data = out.mutable_data();
  for (std::uint64_t i = 0; i < dataset.document_index_size(); ++i) {
    data[i] = static_cast<std::int32_t>(dataset.document_index_at(i));
  }
  return out;
}

py::array_t<std::int64_t> sample_index(const CausalLMDataset& dataset) {
  const std::uint64_t rows = dataset.size() + 1;
  py::array_t<std::int64_t> out({static_cast<py::ssize_t>(rows), py::ssize_t{2}});
  std::int64_t* data = out.mutable_data();
  for (std::uint64_t i = 0; i < rows; ++i) {
    const auto [position, offset] = dataset.sample_index_at(i);
    data[2 * i] = position;
    data[2 * i + 1] = offset;
  }
  return out;
}

py::array_t<std::int64_t> shuffle_index(const CausalLMDataset& dataset) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(dataset.size()));
  std::int64_t* data = out.mutable_data();
  for (std::uint64_t i = 0; i < dataset.size(); ++i) data[i] = dataset.shuffle_index_at(i);
  return out;
}

std::shared_ptr<BlendedDataset> make_blend(const std::vector<std::shared_ptr<TokenDataset>>& datasets,
                                           std::vector<double> weights, std::optional<std::uint64_t> size,
                                           const std::string& cache_dir, bool use_cache) {
  std::vector<std::shared_ptr<const TokenDataset>> parts(datasets.begin(), datasets.end());
  std::vector<std::string> descriptions;
  for (const auto& part : parts) {
    const auto* causal_lm = dynamic_cast<const CausalLMDataset*>(part.get());
    if (use_cache && causal_lm == nullptr) {
      DUFU_FAIL("a cached blend needs CausalLMDatasets (their descriptions key the cache); got '", part->describe(),
                "'. HINT: pass use_cache=False");
    }
    descriptions.push_back(causal_lm != nullptr ? causal_lm->description() : std::string());
  }
  dataprep::BlendOptions options;
  options.size = size;
  options.cache_dir = cache_dir;
  options.use_cache = use_cache;
  std::atomic<bool> stop{false};
  options.stop = &stop;
  return run_interruptibly(stop, [&parts, &weights, &descriptions, &options] {
    return std::make_shared<BlendedDataset>(std::move(parts), std::move(weights), std::move(descriptions),
                                            std::move(options));
  });
}

std::pair<py::array_t<std::int16_t>, py::array_t<std::int64_t>> blend_indices(const BlendedDataset& blend) {
  py::array_t<std::int16_t> datasets(static_cast<py::ssize_t>(blend.size()));
  py::array_t<std::int64_t> samples(static_cast<py::ssize_t>(blend.size()));
  std::int16_t* dataset_data = datasets.mutable_data();
  std::int64_t* sample_data = samples.mutable_data();
  for (std::uint64_t i = 0; i < blend.size(); ++i) {
    std::tie(dataset_data[i], sample_data[i]) = blend.source_of(i);
  }
  return {datasets, samples};
}

using BlendSpec = std::variant<std::string, std::vector<std::pair<double, std::string>>>;

dataprep::BuiltBlend build(const BlendSpec& data_path, const std::string& impl, std::uint64_t seq_length,
                           std::optional<std::uint64_t> num_samples, std::uint32_t seed,
                           std::optional<std::string> split, const std::string& split_part,
                           const std::string& cache_dir, bool use_cache) {
  dataprep::BlendConfig config;
  config.shards = std::holds_alternative<std::string>(data_path)
                      ? dataprep::parse_blend_spec(std::get<std::string>(data_path))
                      : std::get<std::vector<std::pair<double, std::string>>>(data_path);
  config.impl = impl_from_name(impl);
  config.seq_length = seq_length;
  config.num_samples = num_samples;
  config.seed = seed;
  config.split = make_split(split, split_part, {0.0, 1.0});
  config.cache_dir = cache_dir;
  config.use_cache = use_cache;
  std::atomic<bool> stop{false};
  config.stop = &stop;
  return run_interruptibly(stop, [&config] { return dataprep::build_blend(config); });
}

}  // namespace

void bind_datasets(py::module_& module) {
  py::class_<TokenDataset, std::shared_ptr<TokenDataset>>(module, "TokenDataset", R"doc(
Random-access fixed-length samples of seq_length + 1 tokens (inputs are [:-1], labels
[1:]): what the loader reads. dataset[i] is an int32 numpy array.)doc")
      .def("__len__", &TokenDataset::size)
      .def("__getitem__", &sample, py::arg("index"), "Sample `index` (negative counts from the end), int32.")
      .def("get_batch", &samples, py::arg("indices"), "Samples `indices` as one [n, sample_length] int32 array.")
      .def_property_readonly("sample_length", &TokenDataset::sample_length, "Tokens per sample: seq_length + 1.")
      .def("describe", &TokenDataset::describe, "One line describing the dataset.")
      .def("__repr__", [](const TokenDataset& dataset) { return "<dufu " + dataset.describe() + ">"; });

  py::class_<CausalLMDataset, TokenDataset, std::shared_ptr<CausalLMDataset>>(module, "CausalLMDataset", R"doc(
Causal-LM samples over one shard (Megatron's GPTDataset): the split's documents,
repeated for as many epochs as num_samples needs, shuffled with numpy's RandomState as
Megatron does, cut into seq_length + 1 token windows. The indices are cached as .npy
under cache_dir (default $DUFU_CACHE_DIR or ~/.cache/dufu) with the key `dataprep
build-index` uses, so either one builds them and the other maps them.

split is Megatron's "969,30,1" with split_part "train", "valid" or "test"; with split
None, split_range is OSLO's [start, end) fraction of the documents.)doc")
      .def(py::init(&make_causal_lm), py::arg("shard"), py::arg("seq_length"), py::arg("num_samples") = py::none(),
           py::arg("seed") = dataprep::kDefaultSeed, py::arg("split") = py::none(), py::arg("split_part") = "train",
           py::arg("split_range") = std::pair<double, double>{0.0, 1.0}, py::arg("cache_dir") = "",
           py::arg("use_cache") = true)
      .def_property_readonly("num_epochs", &CausalLMDataset::num_epochs)
      .def_property_readonly("cache_path", &CausalLMDataset::cache_path,
                             "The cache key directory ('' when not cached).")
      .def_property_readonly("description", &CausalLMDataset::description, "The canonical text the cache key hashes.")
      .def_property_readonly("document_index", &document_index, "Megatron's document index (int32; a copy).")
      .def_property_readonly("sample_index", &sample_index, "Megatron's sample index, [len + 1, 2] (int64; a copy).")
      .def_property_readonly("shuffle_index", &shuffle_index, "Megatron's shuffle index (int64; a copy).");

  py::class_<BlendedDataset, TokenDataset, std::shared_ptr<BlendedDataset>>(module, "BlendedDataset", R"doc(
A weighted mix of datasets (Megatron's BlendedDataset): sample s comes from the dataset
furthest behind its weight. size None blends exhaustively (weights = dataset sizes).)doc")
      .def(py::init(&make_blend), py::arg("datasets"), py::arg("weights"), py::arg("size") = py::none(),
           py::arg("cache_dir") = "", py::arg("use_cache") = true)
      .def(
          "source_of",
          [](const BlendedDataset& blend, const py::object& index) {
            return blend.source_of(python_index(index, blend.size(), "blend sample"));
          },
          py::arg("index"),
           "(dataset number, sample of that dataset) of blend sample `index`.")
      .def_property_readonly("weights", &BlendedDataset::weights, "The normalized weights.")
      .def_property_readonly("num_datasets", &BlendedDataset::num_datasets)
      .def_property_readonly("cache_path", &BlendedDataset::cache_path)
      .def_property_readonly("indices", &blend_indices,
                             "Megatron's (dataset_index int16, dataset_sample_index int64) arrays (copies).");

  py::class_<dataprep::BuiltBlend>(module, "Blend", "What build_blend returns.")
      .def_property_readonly(
          "dataset",
          [](const dataprep::BuiltBlend& built) { return std::const_pointer_cast<TokenDataset>(built.dataset); },
          "The blend (a BlendedDataset), or the single CausalLMDataset of a one-shard blend.")
      .def_property_readonly("parts",
                             [](const dataprep::BuiltBlend& built) {
                               std::vector<std::shared_ptr<CausalLMDataset>> parts;
                               for (const auto& part : built.parts) {
                                 parts.push_back(std::const_pointer_cast<CausalLMDataset>(part));
                               }
                               return parts;
                             })
      .def_readonly("weights", &dataprep::BuiltBlend::weights)
      .def_readonly("cache_paths", &dataprep::BuiltBlend::cache_paths);

  module.def("build_blend", &build, py::arg("data_path"), py::kw_only(), py::arg("impl") = "mmap",
             py::arg("seq_length") = dataprep::kDefaultSeqLength, py::arg("num_samples") = py::none(),
             py::arg("seed") = dataprep::kDefaultSeed,
             py::arg("split") = "969,30,1", py::arg("split_part") = "train", py::arg("cache_dir") = "",
             py::arg("use_cache") = true, R"doc(
The datasets of a blend exactly as `dataprep build-index` and the trainer build them
(same options, same caches). data_path is Megatron's "0.7 prefixA 0.3 prefixB" or a
list of (weight, prefix); num_samples None: one epoch of each shard, exhaustive blend.)doc");
  module.def("parse_blend_spec", &dataprep::parse_blend_spec, py::arg("spec"),
             "\"0.7 A 0.3 B\" -> [(0.7, 'A'), (0.3, 'B')].");
}

}  // namespace dufu::python
