// state.json of a checkpoint (the trainer's resume): format and version, every field
// with its type and range, the model shape, the layout and the file list it implies.
// A state that reads must read the same through read_checkpoint_state (in a
// directory not named step_<N>, whose number would have to match), and written back
// it must read to the same state and file records.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

#include "checkpoint/checkpoint_state_json.h"  // trainer/src: the reader and writer themselves
#include "dufu/trainer/checkpoint/checkpoint_state.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  namespace json = dufu::trainer::checkpoint_state_json;
  const std::string path = write_input("checkpoint/state.json", data, size);
  std::optional<json::ParsedState> parsed;
  if (!refused_cleanly_or_parsed([&] { parsed.emplace(json::parse(path)); })) return 0;

  const dufu::trainer::TrainingState state =
      dufu::trainer::read_checkpoint_state(scratch_dir() + "/checkpoint", dufu::trainer::FileCheck::kTrust);
  fuzz_require(state == parsed->state, "read_checkpoint_state and parse disagree");

  const std::string copy_dir = scratch_dir() + "/copy";
  std::filesystem::create_directories(copy_dir);
  json::write(copy_dir, parsed->state, parsed->files);
  const json::ParsedState copy = json::parse(copy_dir + "/" + json::kStateFile);
  fuzz_require(copy.state == parsed->state, "the state written back reads differently");
  const auto same_record = [](const auto& a, const auto& b) {
    return a.first == b.first && a.second.bytes == b.second.bytes && a.second.sha256 == b.second.sha256;
  };
  const auto& files = parsed->files;
  fuzz_require(std::equal(copy.files.begin(), copy.files.end(), files.begin(), files.end(), same_record),
               "the file records written back read differently");
  return 0;
}
