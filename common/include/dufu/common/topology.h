// The 3D-parallel rank layout (docs/rank-layout.md; as Megatron, OSLO and LiBai):
// world W = tp x dp x pp and rank = pp_rank*(tp*dp) + dp_rank*tp + tp_rank, tensor
// parallel innermost, pipeline outermost. A Topology is a pure value: it turns
// (world, tp, pp, rank) into this rank's coordinates and the member ranks of its
// groups; Communicator::subgroup turns those lists into communicators.
//
// Worked example, 16 ranks, tp=2, pp=4 (so dp=2): tensor groups [0,1], [2,3], ...;
// data groups [0,2], [1,3], [4,6], ...; pipeline groups [0,4,8,12], [1,5,9,13], ...;
// embedding groups [0,12], [1,13], [2,14], [3,15]; rank 5 = (tp 1, dp 0, pp 1).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dufu {

struct RankCoordinates {
  int tp_rank = 0;
  int dp_rank = 0;
  int pp_rank = 0;
  bool operator==(const RankCoordinates&) const = default;
};

// The groups a rank belongs to; each kind partitions the ranks that take part.
enum class ParallelGroup {
  kTensor,     // same (dp, pp): tp ranks, in tp order
  kData,       // same (tp, pp): dp ranks, in dp order
  kPipeline,   // same (tp, dp): pp ranks, in stage order
  kEmbedding,  // first and last stage of the pipeline group (one rank when pp == 1);
               // ranks of middle stages belong to none (their list is empty)
};

const char* parallel_group_name(ParallelGroup group);  // "tensor", "data", ...

class Topology {
 public:
  // Throws dufu::Error when a size is below 1, when tp x pp does not divide the world
  // size ("world size 6 is not divisible by tensor_parallel_size (4) x
  // pipeline_parallel_size (1)") or when rank is not in [0, world_size).
  Topology(int world_size, int tensor_parallel_size, int pipeline_parallel_size, int rank);

  int world_size() const { return world_size_; }
  int tensor_parallel_size() const { return tp_; }
  int data_parallel_size() const { return dp_; }
  int pipeline_parallel_size() const { return pp_; }
  int rank() const { return rank_; }

  // Coordinates of any rank of the layout, and back; both check their argument.
  RankCoordinates coordinates_of(int rank) const;
  int rank_of(const RankCoordinates& coordinates) const;

  // This rank's coordinates and groups (member world ranks in group-rank order).
  RankCoordinates coordinates() const { return coordinates_; }
  std::vector<int> group(ParallelGroup kind) const;
  std::vector<int> tensor_group() const { return group(ParallelGroup::kTensor); }
  std::vector<int> data_group() const { return group(ParallelGroup::kData); }
  std::vector<int> pipeline_group() const { return group(ParallelGroup::kPipeline); }
  std::vector<int> embedding_group() const { return group(ParallelGroup::kEmbedding); }

  bool is_first_stage() const { return coordinates_.pp_rank == 0; }
  bool is_last_stage() const { return coordinates_.pp_rank == pp_ - 1; }
  // World rank of the neighbouring stage with the same (tp, dp); none at the ends.
  std::optional<int> previous_stage_rank() const;
  std::optional<int> next_stage_rank() const;

  // One line for the start-up log, e.g. "world 16 = tp 2 x dp 2 x pp 4; rank 5 is
  // tp 1, dp 0, pp 1; tensor group [4,5], data group [5,7], pipeline group
  // [1,5,9,13], embedding group [1,13]".
  std::string describe() const;

 private:
  int world_size_;
  int tp_;
  int pp_;
  int dp_;
  int rank_;
  RankCoordinates coordinates_;
};

}  // namespace dufu
