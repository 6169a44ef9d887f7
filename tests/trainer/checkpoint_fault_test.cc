// Fault injection for checkpoints (issue 15): a save is killed at many points and its
// writes fail at many sizes, in a child process each time, and afterwards
//   - the checkpoints saved before are intact and byte-equal;
//   - the newest usable checkpoint is the previous one or the complete new one, and it
//     loads (the run resumes from it with the weights it had);
//   - the next run's clean-up (remove_checkpoint_leftovers, what `train` does once it
//     holds run.dir) leaves no partial or replaced directory, and its own save works.
// The faults: SIGKILL at delays spread over the length of a save; a kill at exactly
// the write that passes N bytes of a file (RLIMIT_FSIZE, with SIGXFSZ turned into
// SIGKILL) for N around every file's size; and a failed write there (RLIMIT_FSIZE with
// SIGXFSZ ignored: EFBIG), which must fail the save with dufu::Error and remove what
// it wrote. Each for a new step and for a new version of an existing step (whose old
// version is moved aside while the new one is renamed into place).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/fork_child.h"
#include "support/gpt_fixture.h"
#include "support/temp_dir.h"

namespace dufu::trainer {
namespace {

namespace fs = std::filesystem;
using dufu::testing::read_all;
using dufu::testing::run_in_child;
using dufu::testing::start_child;
using dufu::testing::TempDir;
using dufu::testing::wait_child;

// The child's exit codes.
constexpr int kSaved = 0;
constexpr int kSaveFailed = 1;  // dufu::Error: the expected end of a failed write

using Snapshot = std::map<std::string, std::string>;  // relative path -> bytes

Snapshot snapshot(const std::string& dir) {
  Snapshot files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[fs::relative(entry.path(), dir).string()] = read_all(entry.path().string());
  }
  return files;
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// A model and moments filled with distinct values from `seed` (no kernels run in
// this process: the children it forks must not inherit an OpenMP pool).
struct Weights {
  GPT model;
  AdamW optimizer;
  explicit Weights(std::uint32_t seed)
      : model(dufu::testing::small_gpt_config(
            {.n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = 100, .vocab_multiple = 64, .seq_length = 16})),
        optimizer(model, AdamWOptions{}) {
    std::uint32_t state = seed;
    const auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
    };
    for (float& x : model.params()) x = next();
    for (float& x : optimizer.m()) x = next();
    for (float& x : optimizer.v()) x = next() + 0.5f;
    // wte's padding rows and their moments are 0 in a real model (no token selects
    // them), and a checkpoint relies on it.
    const ParamTensor& wte = model.tensor("wte.weight");
    const std::size_t real = static_cast<std::size_t>(model.config().vocab_size * model.config().d_model);
    for (const std::span<float> buffer : {model.params(), optimizer.m(), optimizer.v()}) {
      std::fill(buffer.begin() + static_cast<std::ptrdiff_t>(wte.offset + real),
                buffer.begin() + static_cast<std::ptrdiff_t>(wte.offset + wte.size()), 0.0f);
    }
    optimizer.set_step_count(seed);
  }
};

TrainingState state_of(std::int64_t step, const GPT& model) {
  TrainingState state;
  state.step = step;
  state.consumed_samples = static_cast<std::uint64_t>(step) * 8;
  state.consumed_tokens = static_cast<std::uint64_t>(step) * 128;
  state.train_loader_state = "epoch 0";
  state.model = model.config();
  state.config_toml = "# checkpoint_fault_test\n";
  state.shards = {{"data/shard", 1000, 100, std::string(64, 'a'), std::string(64, 'b')}};
  return state;
}

// Where a child's save stops.
enum class Fault { kNone, kFailWriteAt, kKillWriteAt };

extern "C" void kill_self(int) { ::kill(::getpid(), SIGKILL); }

class CheckpointFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = log_level();
    set_log_level(LogLevel::kError);  // the children's warnings and notes would flood the output
    save_checkpoint(run_dir(), old_.model, old_.optimizer, state_of(1, old_.model), kKeep);
    save_checkpoint(run_dir(), old_.model, old_.optimizer, state_of(2, old_.model), kKeep);
    before_ = snapshot(checkpoints());
    for (const auto& [name, bytes] : before_) largest_file_ = std::max(largest_file_, bytes.size());
  }
  void TearDown() override { set_log_level(saved_level_); }

  std::string run_dir() const { return dir_.file("run"); }
  std::string checkpoints() const { return run_dir() + "/checkpoints"; }

  // In a child: saves `step` with the new weights, under the fault; its exit code.
  int save_in_child(std::int64_t step, Fault fault, std::uint64_t bytes) {
    return run_in_child([&] { return save_with_fault(step, fault, bytes); });
  }
  int save_with_fault(std::int64_t step, Fault fault, std::uint64_t bytes) {
    if (fault != Fault::kNone) {
      ::signal(SIGXFSZ, fault == Fault::kFailWriteAt ? SIG_IGN : kill_self);
      const struct rlimit limit = {bytes, bytes};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 90;
    }
    try {
      save_checkpoint(run_dir(), new_.model, new_.optimizer, state_of(step, new_.model), kKeep);
    } catch (const Error&) {
      return kSaveFailed;
    }
    return kSaved;
  }

  // After a save of `step` ended by a fault: what must hold, then the next run's
  // clean-up and the reset for the next fault. `what` names the fault in failures.
  void check_after(std::int64_t step, const std::string& what) {
    SCOPED_TRACE(what);
    const bool replacing = step == 2;
    // What was there before is there, byte for byte, but for the step being
    // replaced, which is the old or the complete new version.
    Snapshot now = snapshot(checkpoints());
    for (const auto& [name, bytes] : before_) {
      if (replacing && name.starts_with("step_00000002/")) continue;
      ASSERT_TRUE(now.contains(name)) << name << " is gone";
      EXPECT_TRUE(now.at(name) == bytes) << name << " changed";
    }
    // The next run: leftovers go (a replaced step_2 whose new version never arrived
    // is put back), then it resumes from the newest usable checkpoint.
    remove_checkpoint_leftovers(run_dir());
    std::set<std::string> expected = {"step_00000001", "step_00000002"};
    const std::set<std::string> names = names_in(checkpoints());
    if (names.contains("step_00000003")) expected.insert("step_00000003");
    EXPECT_EQ(names, expected) << "leftovers after the clean-up";
    const std::optional<std::string> found = find_usable_checkpoint(run_dir());
    ASSERT_TRUE(found.has_value());
    const bool is_new = *found == checkpoints() + "/step_00000003" ||
                        (replacing && read_all(*found + "/model.safetensors") !=
                                          before_.at("step_00000002/model.safetensors"));
    EXPECT_EQ(*found, checkpoints() + (is_new && !replacing ? "/step_00000003" : "/step_00000002"));
    GPT model(new_.model.config());
    AdamW optimizer(model, AdamWOptions{});
    load_checkpoint(*found, model, &optimizer);
    const Weights& expected_weights = is_new ? new_ : old_;
    EXPECT_TRUE(std::equal(model.params().begin(), model.params().end(), expected_weights.model.params().begin()));
    EXPECT_TRUE(std::equal(optimizer.m().begin(), optimizer.m().end(), expected_weights.optimizer.m().begin()));
    EXPECT_TRUE(std::equal(optimizer.v().begin(), optimizer.v().end(), expected_weights.optimizer.v().begin()));
    EXPECT_EQ(optimizer.step_count(), expected_weights.optimizer.step_count());
    // Back to the two old checkpoints for the next fault.
    fs::remove_all(checkpoints() + "/step_00000003");
    if (replacing && is_new) {
      fs::remove_all(checkpoints() + "/step_00000002");
      fs::create_directories(checkpoints() + "/step_00000002");
      for (const auto& [name, bytes] : before_) {
        if (name.starts_with("step_00000002/")) dufu::testing::write_all(checkpoints() + "/" + name, bytes);
      }
    }
    ASSERT_TRUE(snapshot(checkpoints()) == before_);
  }

  // File sizes at which a write fails or the writer dies: the start, the safetensors
  // header, and around the size of every file a checkpoint has.
  std::vector<std::uint64_t> sizes() const {
    std::set<std::uint64_t> sizes = {0, 1, 7, 8, 9, 100, 4095, 4096, 4097, 65536};
    for (const auto& [name, bytes] : before_) {
      const std::uint64_t size = bytes.size();
      for (const std::uint64_t at : {size / 3, size / 2, size - 1, size, size + 1}) sizes.insert(at);
    }
    return {sizes.begin(), sizes.end()};
  }

  static constexpr int kKeep = 5;
  TempDir dir_;
  Weights old_{11};
  Weights new_{22};
  Snapshot before_;
  std::size_t largest_file_ = 0;
  LogLevel saved_level_ = LogLevel::kInfo;
};

TEST_F(CheckpointFaultTest, WriteFailuresAtManySizesLoseNothing) {
  for (const std::int64_t step : {3, 2}) {
    for (const std::uint64_t size : sizes()) {
      const int code = save_in_child(step, Fault::kFailWriteAt, size);
      // A limit at least as large as every file lets the save through; any other ends
      // in dufu::Error, having removed what it wrote.
      EXPECT_EQ(code, size >= largest_file_ ? kSaved : kSaveFailed) << "step " << step << ", limit " << size;
      if (code == kSaveFailed) {
        std::set<std::string> expected = {"step_00000001", "step_00000002"};
        EXPECT_EQ(names_in(checkpoints()), expected) << "a failed save left something, limit " << size;
      }
      check_after(step, "write failure at " + std::to_string(size) + " bytes, step " + std::to_string(step));
    }
  }
}

TEST_F(CheckpointFaultTest, KilledAtTheWriteOfManySizesLosesNothing) {
  for (const std::int64_t step : {3, 2}) {
    for (const std::uint64_t size : sizes()) {
      const int code = save_in_child(step, Fault::kKillWriteAt, size);
      EXPECT_EQ(code, size >= largest_file_ ? kSaved : 128 + SIGKILL)
          << "step " << step << ", limit " << size << ": exit " << code;
      check_after(step, "killed writing byte " + std::to_string(size) + ", step " + std::to_string(step));
    }
  }
}

TEST_F(CheckpointFaultTest, KilledAtManyMomentsLosesNothing) {
  // How long a save takes here, then kills spread over that time (and a little after).
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(save_in_child(3, Fault::kNone, 0), kSaved);
  const auto length = std::chrono::steady_clock::now() - start;
  check_after(3, "the timing save");
  constexpr int kMoments = 24;
  int killed = 0;
  for (const std::int64_t step : {3, 2}) {
    for (int k = 0; k <= kMoments; ++k) {
      const pid_t child = start_child([&] { return save_with_fault(step, Fault::kNone, 0); });
      std::this_thread::sleep_for(length * k / kMoments);
      ::kill(child, SIGKILL);
      const int code = wait_child(child);
      EXPECT_TRUE(code == 128 + SIGKILL || code == kSaved) << "exit " << code;
      killed += code == 128 + SIGKILL;
      check_after(step, "killed after " + std::to_string(k) + "/" + std::to_string(kMoments) + " of a save, step " +
                            std::to_string(step));
    }
  }
  EXPECT_GT(killed, 0) << "no kill landed before the save ended";
}

// After all that, the run goes on: the resumed run's own save lands next to the old
// checkpoints, with nothing else in the directory.
TEST_F(CheckpointFaultTest, TheNextRunSavesAndLeavesNoLeftovers) {
  ASSERT_EQ(save_in_child(3, Fault::kKillWriteAt, 4096), 128 + SIGKILL);
  ASSERT_EQ(save_in_child(4, Fault::kKillWriteAt, 100), 128 + SIGKILL);
  std::set<std::string> names = names_in(checkpoints());
  EXPECT_EQ(std::count_if(names.begin(), names.end(), [](const std::string& n) {
              return n.find(".partial-") != std::string::npos;
            }),
            2);
  // The next process saves (a save cleans up too, without the explicit call).
  save_checkpoint(run_dir(), new_.model, new_.optimizer, state_of(3, new_.model), kKeep);
  EXPECT_EQ(names_in(checkpoints()), (std::set<std::string>{"step_00000001", "step_00000002", "step_00000003"}));
  EXPECT_EQ(find_usable_checkpoint(run_dir()), checkpoints() + "/step_00000003");
}

}  // namespace
}  // namespace dufu::trainer
