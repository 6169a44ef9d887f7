// `dataprep preprocess` under mpirun or srun (distributed_preprocess.h): rank 0 locks
// the output and describes the inputs, every rank writes its part beside the output
// into an anonymous file (a hidden name where the file system has none) while the
// ranks meet every 200 ms, then the ranks copy their parts into the output's
// temporaries at their offsets and rank 0 renames the pair.
// Every step that can fail on one rank ends in an agreement (settle), so all ranks
// stop together, remove what they wrote, and rank 0 names the first failing rank's
// error. Nothing of the job is left under the final names unless it all succeeded.
// run_preprocess, at the end, is the tool's choice between the undivided, sharded and
// MPI runs.
#include "dufu/dataprep/distributed_preprocess.h"

#include <dirent.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <thread>

#include "dufu/common/atomic_file.h"
#include "dufu/common/launch_environment.h"
#include "dufu/common/log.h"
#include "dufu/dataprep/anonymous_file.h"
#include "dufu/dataprep/indexed_dataset_writer.h"
#include "dufu/dataprep/part_join.h"
#include "dufu/dataprep/preprocess_part.h"
#include "dufu/dataprep/preprocess_plan.h"
#include "dufu/dataprep/shard_output.h"
#include "preprocess_pipeline.h"
#include "preprocess_sidecar.h"

namespace dufu::dataprep {
namespace {

constexpr std::chrono::milliseconds kHeartbeat{200};
constexpr std::size_t kReportedErrors = 10;

struct SplitName {
  std::string dir;  // with its trailing '/', or empty
  std::string name;
};
SplitName split_name(const std::string& prefix) {
  const auto slash = prefix.rfind('/');
  if (slash == std::string::npos) return {"", prefix};
  return {prefix.substr(0, slash + 1), prefix.substr(slash + 1)};
}

// Where rank R of N writes its part of output prefix DIR/NAME on a file system without
// anonymous files: DIR/.NAME.rank-R-of-N.
std::string rank_part_prefix(const std::string& prefix, int rank, int ranks) {
  const SplitName parts = split_name(prefix);
  return str_cat(parts.dir, ".", parts.name, ".rank-", rank, "-of-", ranks);
}

// Under the output's lock no job writes there, so every rank part's file (finished,
// temporary, lock, marker) is a leftover of a job that was killed (named parts only
// exist where the file system has no anonymous files, or were left by older versions).
void remove_rank_leftovers(const std::string& prefix) {
  const SplitName parts = split_name(prefix);
  const std::string heads[] = {"." + parts.name + ".rank-", ".." + parts.name + ".rank-"};
  DIR* dir = ::opendir(parts.dir.empty() ? "." : parts.dir.c_str());
  if (dir == nullptr) return;
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    for (const auto& head : heads) {
      if (name.starts_with(head) && ::unlink((parts.dir + name).c_str()) == 0) ++removed;
    }
  }
  ::closedir(dir);
  if (removed > 0) DUFU_LOG_INFO("DATA", "removed ", removed, " file(s) that killed ranks of '", prefix, "' left");
}

std::span<std::uint8_t> bytes_of(std::string& text) {
  return {reinterpret_cast<std::uint8_t*>(text.data()), text.size()};
}

void broadcast_string(Communicator& world, std::string& text, int root) {
  auto size = static_cast<std::int64_t>(text.size());
  world.broadcast(std::span<std::int64_t>(&size, 1), root);
  text.resize(static_cast<std::size_t>(size));
  if (size > 0) world.broadcast(bytes_of(text), root);
}

// The agreement after a step: if any rank's `error` is non-empty, every rank throws
// RanksStopped with the lowest such rank's message.
void settle(Communicator& world, std::string error) {
  const int ranks = world.size();
  const std::int32_t marker = error.empty() ? 0 : ranks - world.rank();
  const std::int32_t highest = world.all_reduce_value(marker, ReduceOp::kMax);
  if (highest == 0) return;
  const int failed = ranks - highest;
  broadcast_string(world, error, failed);
  throw RanksStopped(str_cat(error, " (rank ", failed, " of ", ranks, "; every rank stopped)"), world.rank() == 0);
}

// Runs `step` on this rank, then settle().
template <typename Step>
void agree(Communicator& world, Step&& step) {
  std::string error;
  try {
    step();
  } catch (const std::bad_alloc&) {
    error = "not enough memory (an allocation failed); lower `workers` or `max_document_bytes`";
  } catch (const std::exception& failure) {
    error = failure.what();
  }
  settle(world, std::move(error));
}

// Files this rank made that must go whatever happens: removed by the destructor, and
// by the signal handlers if the launcher stops the rank first.
class RemovedAtEnd {
 public:
  void add(const std::string& path) { slots_.emplace_back(path, register_cleanup_path(path)); }
  ~RemovedAtEnd() {
    for (const auto& [path, slot] : slots_) {
      ::unlink(path.c_str());
      unregister_cleanup_path(slot);
    }
  }

 private:
  std::vector<std::pair<std::string, int>> slots_;
};

// This rank's part of one output: written into an anonymous file in the output's
// directory, which the kernel frees however the rank ends (mpirun's SIGKILL, a second
// after its SIGTERM, ends ranks whose signal handlers have not run yet). Where
// the file system refuses anonymous files, under the hidden name rank_part_prefix(),
// removed at the end or by the signal handlers, and otherwise by the next job.
class RankPart {
 public:
  RankPart(const std::string& prefix, int rank, int ranks) : prefix_(prefix), rank_(rank), ranks_(ranks) {}

  // The writer of the part (only one per part).
  std::unique_ptr<IndexedDatasetWriter> writer(IndexLayout layout, DType dtype, RemovedAtEnd& removed) {
    const std::string part = str_cat(" (rank ", rank_, "'s part)");
    std::optional<AnonymousFile> bin =
        AnonymousFile::create(split_name(prefix_).dir, str_cat("'", bin_path(prefix_), "'", part));
    if (bin) return std::make_unique<IndexedDatasetWriter>(std::move(*bin), prefix_ + part, layout, dtype);
    static std::once_flag warned;  // once per process: a rank runs one job
    std::call_once(warned, [&] {
      DUFU_LOG_WARN("DATA", "the directory of '", prefix_, "' cannot hold anonymous files (O_TMPFILE): ranks write ",
                    "their parts under hidden names there, which a rank killed without warning leaves behind until ",
                    "the next job on the output removes them");
    });
    named_ = rank_part_prefix(prefix_, rank_, ranks_);
    removed.add(bin_path(named_));
    removed.add(idx_path(named_));
    return std::make_unique<IndexedDatasetWriter>(named_, layout, dtype);
  }
  // After the pipeline: the writer's part is complete.
  void finish(IndexedDatasetWriter& writer) {
    if (named_.empty()) {
      anonymous_.emplace(writer.finish_anonymous());
    } else {
      // Not commit(): the pair commit holds SIGTERM back for its renames and fsyncs,
      // longer than mpirun waits before its SIGKILL when another rank died.
      writer.commit_scratch();
    }
  }
  PartShape shape() const {
    return anonymous_ ? anonymous_shard_shape(*anonymous_) : read_part_shape(named_, nullptr, nullptr);
  }
  // Copies the part to its place in `target`, then lets it go.
  void join_into(JoinTarget& target, const JoinLayout& join) {
    if (anonymous_) {
      target.write_part(join, static_cast<std::size_t>(rank_), *anonymous_);
      anonymous_.reset();
    } else {
      target.write_part(join, static_cast<std::size_t>(rank_), named_);
      ::unlink(bin_path(named_).c_str());
      ::unlink(idx_path(named_).c_str());
    }
  }

 private:
  std::string prefix_;
  int rank_, ranks_;
  std::string named_;  // the hidden prefix, where the part has a name
  std::optional<AnonymousShard> anonymous_;
};

// Thrown by the heartbeat into this rank's pipeline when another rank failed.
struct StopRequested {};

// The ranks' meeting: progress counters summed (rank 0 shows them), failures and
// finished ranks counted.
class Heartbeat {
 public:
  Heartbeat(Communicator& world, const Progress& local, Progress* shown)
      : world_(world), local_(local), shown_(shown) {}

  struct Round {
    int failed_rank = -1;
    bool all_done = false;
  };
  Round beat(bool failed, bool done) {
    crash_point("preprocess:heartbeat");  // tests kill a rank here, as the OOM killer would
    std::array<std::int64_t, 4> sums{done ? 1 : 0};
    for (std::size_t c = 0; c < 3; ++c) {
      const std::uint64_t now = local_.value(c);
      sums[c + 1] = static_cast<std::int64_t>(now - reported_[c]);
      reported_[c] = now;
    }
    world_.all_reduce(sums);
    const std::int32_t marker = failed ? world_.size() - world_.rank() : 0;
    const std::int32_t highest = world_.all_reduce_value(marker, ReduceOp::kMax);
    if (shown_ != nullptr) {  // one redraw for the three
      shown_->add_each({static_cast<std::uint64_t>(sums[1]), static_cast<std::uint64_t>(sums[2]),
                        static_cast<std::uint64_t>(sums[3])});
    }
    return Round{highest > 0 ? world_.size() - highest : -1, sums[0] == world_.size()};
  }

 private:
  Communicator& world_;
  const Progress& local_;
  Progress* shown_;
  std::array<std::uint64_t, 3> reported_{};
};

// Rank 0 creates a file beside the output; every rank must read it back.
void check_shared_output_directory(Communicator& world, const std::string& prefix) {
  std::optional<AtomicFile> probe;
  std::string path_and_token;
  agree(world, [&] {
    if (world.rank() != 0) return;
    const SplitName parts = split_name(prefix);
    probe.emplace(str_cat(parts.dir, ".", parts.name, ".rank-probe"));
    const std::string token = str_cat("dufu rank probe ", std::random_device{}(), " ", ::getpid());
    probe->write(token.data(), token.size());
    probe->prepare();
    path_and_token = probe->temp_path() + '\n' + token;
  });
  broadcast_string(world, path_and_token, 0);
  const std::string path = path_and_token.substr(0, path_and_token.find('\n'));
  const std::string token = path_and_token.substr(path.size() + 1);
  agree(world, [&] {
    std::ifstream in(path, std::ios::binary);
    const std::string seen{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (seen != token) {
      char host[256] = "?";
      ::gethostname(host, sizeof(host) - 1);
      DUFU_FAIL("rank ", world.rank(), " (on ", host, ") cannot see '", path, "', which rank 0 created beside the ",
                "output '", prefix, "': the output directory must be on a file system that every rank shares");
    }
  });
}

// The first kReportedErrors messages of all ranks, in rank order (= input order).
std::vector<std::string> gather_first_errors(Communicator& world, const std::vector<std::string>& mine) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world.size()));
  const std::int64_t own = static_cast<std::int64_t>(mine.size());
  world.all_gather(std::span<const std::int64_t>(&own, 1), counts);
  std::vector<std::string> errors;
  for (int r = 0; r < world.size() && errors.size() < kReportedErrors; ++r) {
    if (counts[static_cast<std::size_t>(r)] == 0) continue;
    std::string joined;
    if (r == world.rank()) {
      for (const auto& message : mine) joined += message + '\0';
    }
    broadcast_string(world, joined, r);
    for (std::size_t at = 0; at < joined.size() && errors.size() < kReportedErrors;) {
      const std::size_t end = joined.find('\0', at);
      errors.push_back(joined.substr(at, end - at));
      at = end + 1;
    }
  }
  return errors;
}

}  // namespace

PreprocessStats preprocess_distributed(const PreprocessOptions& options, Communicator& world, Progress* progress) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = world.rank(), ranks = world.size();
  Progress* shown = rank == 0 ? progress : nullptr;

  // Every rank checks the options and loads the tokenizer, and the ranks compare what
  // decides the output before anything is written; then rank 0 alone locks the
  // outputs and looks at the inputs, so they are described once.
  std::optional<PreprocessSetup> setup;
  std::vector<AgreedSetting> settings;
  agree(world, [&] {
    check_joinable_layout(output_layout(options));
    setup.emplace(set_up_preprocess(options));
    settings = preprocess_job_settings(options, *setup);
  });
  if (const std::optional<std::string> difference = rank_disagreement(world, settings)) {
    throw RanksStopped(*difference, rank == 0);
  }
  std::vector<std::unique_ptr<ShardOutputLock>> locks;
  std::string inputs_text;
  agree(world, [&] {
    if (rank != 0) return;
    for (const auto& prefix : setup->output_prefixes) {
      locks.push_back(std::make_unique<ShardOutputLock>(prefix));
      remove_rank_leftovers(prefix);
    }
    PreprocessPlan described;
    described.inputs = describe_inputs(setup->inputs, options.reader, ranks);
    inputs_text = described.inputs_text();
  });
  broadcast_string(world, inputs_text, 0);
  const PreprocessPlan plan = divide_inputs(parse_plan_inputs(inputs_text), ranks);
  check_shared_output_directory(world, setup->output_prefixes.front());
  if (shown) {
    std::uint64_t total = 0;
    for (const PlanInput& input : plan.inputs) total += input.bytes;
    shown->set_total(total);
  }

  // Each rank's part, written without names with the ranks meeting meanwhile.
  PreprocessStats stats;
  RemovedAtEnd removed;
  std::vector<RankPart> parts;
  for (const auto& prefix : setup->output_prefixes) parts.emplace_back(prefix, rank, ranks);
  const IndexLayout layout = output_layout(options);
  Progress local("rank", {{"bytes", 1}, {"docs", 1}, {"tokens", 1}}, ProgressOptions{.quiet = true});
  Heartbeat heartbeat(world, local, shown);
  std::string failure;
  int failed_rank = -1;
  bool stopped = false;
  try {
    DocumentReader reader(plan.part_inputs(rank), options.reader);
    std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
    for (auto& part : parts) writers.push_back(part.writer(layout, setup->dtype, removed));
    const PipelineTick tick{.interval = kHeartbeat, .call = [&] {
                              const Heartbeat::Round round = heartbeat.beat(false, false);
                              if (round.failed_rank >= 0) {
                                failed_rank = round.failed_rank;
                                throw StopRequested{};
                              }
                            }};
    run_pipeline(options, *setup, reader, writers, &local, &stats, &tick);
    for (std::size_t key = 0; key < parts.size(); ++key) parts[key].finish(*writers[key]);
  } catch (const StopRequested&) {
    stopped = true;
  } catch (const std::bad_alloc&) {
    failure = "not enough memory (an allocation failed); lower `workers` or `max_document_bytes`";
  } catch (const std::exception& error) {
    failure = error.what();
  }
  while (!stopped) {
    const Heartbeat::Round round = heartbeat.beat(!failure.empty(), true);
    if (round.failed_rank >= 0) {
      failed_rank = round.failed_rank;
      break;
    }
    if (round.all_done) break;
    std::this_thread::sleep_for(kHeartbeat);
  }
  if (failed_rank >= 0) {
    broadcast_string(world, failure, failed_rank);
    throw RanksStopped(str_cat(failure, " (rank ", failed_rank, " of ", ranks, "; every rank stopped)"), rank == 0);
  }

  // The join: every rank copies its part to its offsets; rank 0 writes the header
  // first and renames the pair last.
  const std::size_t keys = parts.size();
  std::vector<std::int64_t> my_shapes;
  agree(world, [&] {
    for (const auto& part : parts) {
      const PartShape shape = part.shape();
      for (const std::uint64_t value : {shape.sequences, shape.documents, shape.tokens}) {
        my_shapes.push_back(static_cast<std::int64_t>(value));
      }
    }
  });
  std::vector<std::int64_t> shapes(my_shapes.size() * static_cast<std::size_t>(ranks));
  world.all_gather(my_shapes, shapes);
  for (std::size_t key = 0; key < keys; ++key) {
    std::vector<PartShape> key_shapes;
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t* shape = &shapes[(static_cast<std::size_t>(r) * keys + key) * 3];
      key_shapes.push_back(PartShape{static_cast<std::uint64_t>(shape[0]), static_cast<std::uint64_t>(shape[1]),
                                     static_cast<std::uint64_t>(shape[2])});
    }
    const JoinLayout join(key_shapes, layout, setup->dtype);
    const std::string& prefix = setup->output_prefixes[key];
    std::optional<AtomicFile> bin, idx;
    std::string temps;
    agree(world, [&] {
      if (rank != 0) return;
      bin.emplace(bin_path(prefix));
      idx.emplace(idx_path(prefix));
      JoinTarget target(bin->temp_path(), idx->temp_path());
      target.set_sizes(join);
      target.write_header(join);
      target.finish();
      temps = bin->temp_path() + '\n' + idx->temp_path();
    });
    broadcast_string(world, temps, 0);
    agree(world, [&] {
      const std::string bin_temp = temps.substr(0, temps.find('\n'));
      JoinTarget target(bin_temp, temps.substr(bin_temp.size() + 1));
      parts[key].join_into(target, join);
      target.finish();
    });
    agree(world, [&] {
      if (rank != 0) return;
      commit_shard_pair(*bin, *idx, prefix);
      publish_shard_sidecar(prefix, preprocess_sidecar(options, *setup, key));
    });
    stats.output_bytes += join.bin_bytes() + join.idx_bytes();
  }
  locks.clear();

  // The job's totals, on every rank.
  std::array<std::int64_t, 7> totals{};
  const std::uint64_t mine[] = {stats.documents, stats.records,     stats.empty_skipped, stats.bad_skipped,
                                stats.tokens,    stats.input_bytes, stats.text_bytes};
  for (std::size_t i = 0; i < totals.size(); ++i) totals[i] = static_cast<std::int64_t>(mine[i]);
  world.all_reduce(totals);
  stats.documents = static_cast<std::uint64_t>(totals[0]);
  stats.records = static_cast<std::uint64_t>(totals[1]);
  stats.empty_skipped = static_cast<std::uint64_t>(totals[2]);
  stats.bad_skipped = static_cast<std::uint64_t>(totals[3]);
  stats.tokens = static_cast<std::uint64_t>(totals[4]);
  stats.input_bytes = static_cast<std::uint64_t>(totals[5]);
  stats.text_bytes = static_cast<std::uint64_t>(totals[6]);
  stats.first_errors = gather_first_errors(world, stats.first_errors);
  stats.dtype = setup->dtype;
  stats.output_prefixes = setup->output_prefixes;
  if (shown) shown->finish();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

PreprocessStats run_preprocess(const PreprocessOptions& options, const std::optional<ShardSpec>& shard,
                               Progress* progress) {
  const LaunchEnvironment launch = detect_launch_environment();
  if (shard) {
    if (launch.world_size > 1) {
      DUFU_FAIL("`shard` ", shard->part, "/", shard->parts, " under ", launch.describe(),
                ": the launcher already divides the job among its ranks; use one or the other");
    }
    return preprocess_part(options, *shard, progress);
  }
  if (launch.world_size > 1) {
    const auto world = make_communicator(launch);
    return preprocess_distributed(options, *world, progress);
  }
  return preprocess(options, progress);
}

}  // namespace dufu::dataprep
