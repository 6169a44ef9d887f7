// Saving and loading a parallel run's checkpoint, each rank its own piece. The one
// exchange is a fixed-size record per rank (did it write, which files, their sizes and
// digests), gathered everywhere, so every rank reaches the same verdict and none waits
// for a rank that failed.
#include "dufu/trainer/checkpoint/parallel_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "checkpoint_directory.h"
#include "checkpoint_files.h"
#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "host_staging.h"

namespace dufu::trainer {

namespace {

namespace fs = std::filesystem;
using checkpoint_files::FileRecord;
using checkpoint_files::Piece;

constexpr const char* kLog = "CKPT";

// The files one rank wrote, as it travels: ok flag, then up to two (name, size,
// SHA-256) entries in fixed-width fields.
constexpr std::size_t kNameBytes = 64;
constexpr std::size_t kDigestBytes = 64;
constexpr std::size_t kEntryBytes = kNameBytes + 8 + kDigestBytes;
constexpr std::size_t kMaxFilesPerRank = 2;
constexpr std::size_t kRecordBytes = 1 + kMaxFilesPerRank * kEntryBytes;

std::vector<std::uint8_t> encode_record(bool ok, const std::map<std::string, FileRecord>& files) {
  std::vector<std::uint8_t> record(kRecordBytes, 0);
  record[0] = ok ? 1 : 0;
  std::size_t at = 1;
  for (const auto& [name, file] : files) {
    DUFU_CHECK(name.size() < kNameBytes && file.sha256.size() == kDigestBytes && at + kEntryBytes <= kRecordBytes,
               "checkpoint file record for ", name);
    std::memcpy(record.data() + at, name.data(), name.size());
    for (int byte = 0; byte < 8; ++byte) record[at + kNameBytes + static_cast<std::size_t>(byte)] =
        static_cast<std::uint8_t>(file.bytes >> (8 * byte));
    std::memcpy(record.data() + at + kNameBytes + 8, file.sha256.data(), kDigestBytes);
    at += kEntryBytes;
  }
  return record;
}

void decode_record(const std::uint8_t* record, std::map<std::string, FileRecord>& files) {
  for (std::size_t entry = 0; entry < kMaxFilesPerRank; ++entry) {
    const std::uint8_t* at = record + 1 + entry * kEntryBytes;
    const std::string name(reinterpret_cast<const char*>(at), strnlen(reinterpret_cast<const char*>(at), kNameBytes));
    if (name.empty()) continue;
    FileRecord file;
    for (int byte = 0; byte < 8; ++byte) file.bytes |= static_cast<std::uint64_t>(at[kNameBytes + byte]) << (8 * byte);
    file.sha256.assign(reinterpret_cast<const char*>(at + kNameBytes + 8), kDigestBytes);
    files[name] = file;
  }
}

Piece piece_of_model(const GPT& model) {
  Piece piece;
  piece.config = model.config();
  piece.tp = model.tensor_parallel_size();
  piece.tp_rank = model.tensor_parallel_rank();
  piece.stage = model.pipeline_stage();
  return piece;
}

bool same_stage(const PipelineStage& a, const PipelineStage& b) {
  return a.stage == b.stage && a.num_stages == b.num_stages && a.first_layer == b.first_layer &&
         a.num_layers == b.num_layers;
}

// This rank's files in the partial directory, with their records.
std::map<std::string, FileRecord> write_rank_files(const std::string& partial, const RankPlace& place,
                                                   const GPT& model, const DataParallelOptimizer& optimizer,
                                                   const CheckpointLayout& layout) {
  const Piece piece = piece_of_model(model);
  const AdamW& moments = optimizer.local_state();
  std::map<std::string, FileRecord> files;
  const auto record = [&](const std::string& name) {
    files[name] = checkpoint_files::describe_file((fs::path(partial) / name).string());
  };
  const auto path = [&](const std::string& name) { return (fs::path(partial) / name).string(); };
  // Only this rank's piece, in one host buffer; a data-parallel replica other than the
  // first writes no weights, so it does not download them.
  const bool writes_model = place.dp_rank == 0;
  const bool writes_moments = layout.optimizer_sharded || place.dp_rank == 0;
  const host_staging::StagedState staged(model, writes_moments ? &moments : nullptr, writes_model);
  if (writes_model) {
    const std::string name = model_file_name(layout, place.tp_rank, place.pp_rank);
    checkpoint_files::write_model(path(name), piece, staged.params());
    record(name);
  }
  if (layout.optimizer_sharded) {
    const std::string name = optimizer_file_name(layout, place.tp_rank, place.pp_rank, place.dp_rank);
    checkpoint_files::write_optimizer_shard(path(name), piece, moments.shard_begin(), staged.m(), staged.v(),
                                            moments.step_count());
    record(name);
  } else if (place.dp_rank == 0) {
    const std::string name = optimizer_file_name(layout, place.tp_rank, place.pp_rank, 0);
    checkpoint_files::write_optimizer(path(name), piece, staged.m(), staged.v(), moments.step_count());
    record(name);
  }
  return files;
}

}  // namespace

std::string save_parallel_checkpoint(const std::string& run_dir, Communicator& world, const RankPlace& place,
                                     const GPT& model, const DataParallelOptimizer& optimizer,
                                     const TrainingState& state, int keep_last) {
  const CheckpointLayout& layout = state.layout;
  DUFU_CHECK(layout.optimizer_sharded == optimizer.sharded() &&
                 layout.tensor_parallel_size == model.tensor_parallel_size() &&
                 layout.pipeline_parallel_size == model.pipeline_stage().num_stages,
             "save_parallel_checkpoint: the state's layout is not the model's");
  if (keep_last < 1) DUFU_FAIL("save_parallel_checkpoint: keep_last must be at least 1, got ", keep_last);
  const bool is_first = world.rank() == 0;

  // The directory is named after world rank 0's process, which creates it.
  std::string partial;
  std::int64_t created[2] = {static_cast<std::int64_t>(::getpid()), 1};  // pid, ok
  std::string failure;
  if (is_first) {
    try {
      partial = checkpoint_directory::create_step_partial(run_dir, state.step, created[0]);
    } catch (const Error& e) {
      failure = e.what();
      created[1] = 0;
    }
  }
  world.broadcast(std::span<std::int64_t>(created, 2), 0);
  if (created[1] == 0) {
    if (is_first) DUFU_FAIL(failure);
    DUFU_FAIL("checkpoint of step ", state.step, ": rank 0 could not create its directory");
  }
  if (!is_first) {
    partial = checkpoint_directory::partial_path(checkpoint_directory::step_path(run_dir, state.step), created[0]);
  }

  std::map<std::string, FileRecord> mine;
  bool ok = true;
  try {
    mine = write_rank_files(partial, place, model, optimizer, layout);
  } catch (const Error& e) {
    ok = false;
    // With several ranks the others only learn which failed; a single process says it
    // once, in its error.
    if (world.size() > 1) {
      DUFU_LOG_ERROR(kLog, "rank ", world.rank(), ": cannot write its part of the checkpoint of step ", state.step,
                     ": ", e.what());
    }
    failure = e.what();
  }
  const std::vector<std::uint8_t> record = encode_record(ok, mine);
  std::vector<std::uint8_t> records(kRecordBytes * static_cast<std::size_t>(world.size()));
  world.all_gather(record, records);
  std::string failed_ranks;
  std::map<std::string, FileRecord> files;
  for (int rank = 0; rank < world.size(); ++rank) {
    const std::uint8_t* entry = records.data() + kRecordBytes * static_cast<std::size_t>(rank);
    if (entry[0] == 0) failed_ranks += str_cat(failed_ranks.empty() ? "" : ", ", rank);
    decode_record(entry, files);
  }
  if (!failed_ranks.empty()) {
    if (is_first) checkpoint_directory::abandon(partial);
    if (!ok) DUFU_FAIL("checkpoint of step ", state.step, ": ", failure);
    DUFU_FAIL("checkpoint of step ", state.step, " not written: rank(s) ", failed_ranks,
              " could not write their files (their errors say why)");
  }

  std::int64_t published = 1;
  std::string final_dir;
  if (is_first) {
    try {
      final_dir = checkpoint_directory::publish_step(run_dir, partial, state, files, keep_last);
    } catch (const Error& e) {
      failure = e.what();
      published = 0;
    }
  }
  world.broadcast(std::span<std::int64_t>(&published, 1), 0);
  if (published == 0) {
    if (is_first) DUFU_FAIL(failure);
    DUFU_FAIL("checkpoint of step ", state.step, " not written: rank 0 could not finish it");
  }
  return is_first ? final_dir : checkpoint_directory::step_path(run_dir, state.step);
}

void load_parallel_checkpoint(const std::string& checkpoint_dir, const TrainingState& saved, const RankPlace& place,
                              int data_parallel_size, GPT& model, DataParallelOptimizer& optimizer) {
  const CheckpointLayout& layout = saved.layout;
  const GPTConfig& config = model.config();
  const Piece piece = piece_of_model(model);
  const auto path = [&](const std::string& name) { return (fs::path(checkpoint_dir) / name).string(); };
  AdamW& moments = optimizer.local_state();
  const bool same_piece = layout.tensor_parallel_size == piece.tp &&
                          layout.pipeline_parallel_size == piece.stage.num_stages &&
                          same_stage(checkpoint_files::piece_of(config, layout, place.tp_rank, place.pp_rank).stage,
                                     piece.stage);
  Device& device = model.parameter_device();  // the moments' too (AdamW takes it)
  if (!same_piece) {
    // Assembled on the host (the CPU device), then this rank's piece is uploaded.
    GPT full_model(config);
    AdamW full_state(full_model, moments.options());
    load_checkpoint(checkpoint_dir, full_model, &full_state);
    std::vector<float> host(model.num_parameters());
    shard_gpt_piece(config, piece.tp, piece.tp_rank, piece.stage, full_model.params(), host);
    model.upload_parameters(host);
    AdamW piece_state = optimizer.make_full_state();
    shard_gpt_piece(config, piece.tp, piece.tp_rank, piece.stage, full_state.m(), host);
    host_staging::upload(device, piece_state.m(), host);
    shard_gpt_piece(config, piece.tp, piece.tp_rank, piece.stage, full_state.v(), host);
    host_staging::upload(device, piece_state.v(), host);
    piece_state.set_step_count(full_state.step_count());
    optimizer.load_full_state(piece_state);
    return;
  }
  // Each file is read into host memory and checked before anything reaches the device.
  std::vector<float> host_params(model.num_parameters());
  checkpoint_files::read_model(path(model_file_name(layout, place.tp_rank, place.pp_rank)), piece, host_params);
  if (layout.optimizer_sharded && optimizer.sharded() && layout.data_parallel_size == data_parallel_size) {
    const std::string name = optimizer_file_name(layout, place.tp_rank, place.pp_rank, place.dp_rank);
    std::vector<float> m(moments.num_parameters()), v(moments.num_parameters());
    const std::int64_t step_count =
        checkpoint_files::read_optimizer_shard(path(name), piece, moments.shard_begin(), m, v);
    model.upload_parameters(host_params);
    host_staging::upload(device, moments.m(), m);
    host_staging::upload(device, moments.v(), v);
    moments.set_step_count(step_count);
    return;
  }
  // The piece's whole moments, from one file or the data-parallel shards.
  std::vector<float> m(model.num_parameters()), v(model.num_parameters());
  std::int64_t step_count = 0;
  if (!layout.optimizer_sharded) {
    step_count = checkpoint_files::read_optimizer(path(optimizer_file_name(layout, place.tp_rank, place.pp_rank, 0)),
                                                  piece, m, v);
  } else {
    for (int d = 0; d < layout.data_parallel_size; ++d) {
      const auto [begin, end] = zero_shard_range(model.num_parameters(), layout.data_parallel_size, d);
      const std::string name = optimizer_file_name(layout, place.tp_rank, place.pp_rank, d);
      const std::int64_t shard_step_count = checkpoint_files::read_optimizer_shard(
          path(name), piece, begin, std::span<float>(m).subspan(begin, end - begin),
          std::span<float>(v).subspan(begin, end - begin));
      if (d > 0 && shard_step_count != step_count) {
        DUFU_FAIL(checkpoint_dir, ": ", name, " has step count ", shard_step_count,
                  ", the shard of data-parallel rank 0 ", step_count);
      }
      step_count = shard_step_count;
    }
  }
  model.upload_parameters(host_params);
  AdamW piece_state = optimizer.make_full_state();
  host_staging::upload(device, piece_state.m(), m);
  host_staging::upload(device, piece_state.v(), v);
  piece_state.set_step_count(step_count);
  optimizer.load_full_state(piece_state);
}

}  // namespace dufu::trainer
