// Rank arithmetic of the 3D-parallel layout; see topology.h and docs/rank-layout.md.
// Every number here is checked against a plain nested loop in topology_test.cc.
#include "dufu/common/topology.h"

#include <cstdint>

#include "dufu/common/error.h"

namespace dufu {

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += str_cat(i == 0 ? "" : ",", ranks[i]);
  return text + "]";
}

}  // namespace

const char* parallel_group_name(ParallelGroup group) {
  switch (group) {
    case ParallelGroup::kTensor: return "tensor";
    case ParallelGroup::kData: return "data";
    case ParallelGroup::kPipeline: return "pipeline";
    case ParallelGroup::kEmbedding: return "embedding";
  }
  return "unknown";
}

Topology::Topology(int world_size, int tensor_parallel_size, int pipeline_parallel_size, int rank)
    : world_size_(world_size), tp_(tensor_parallel_size), pp_(pipeline_parallel_size), dp_(0), rank_(rank) {
  if (world_size < 1) DUFU_FAIL("world size must be at least 1, got ", world_size);
  if (tp_ < 1) DUFU_FAIL("tensor_parallel_size must be at least 1, got ", tp_);
  if (pp_ < 1) DUFU_FAIL("pipeline_parallel_size must be at least 1, got ", pp_);
  const std::int64_t model_parallel = static_cast<std::int64_t>(tp_) * pp_;
  if (world_size % model_parallel != 0) {
    DUFU_FAIL("world size ", world_size, " is not divisible by tensor_parallel_size (", tp_,
              ") x pipeline_parallel_size (", pp_, "); HINT: launch a multiple of ", model_parallel,
              " ranks or choose sizes whose product divides ", world_size);
  }
  dp_ = static_cast<int>(world_size / model_parallel);
  coordinates_ = coordinates_of(rank);
}

RankCoordinates Topology::coordinates_of(int rank) const {
  if (rank < 0 || rank >= world_size_) DUFU_FAIL("rank ", rank, " is outside world size ", world_size_);
  const int within_stage = rank % (tp_ * dp_);
  return RankCoordinates{within_stage % tp_, within_stage / tp_, rank / (tp_ * dp_)};
}

int Topology::rank_of(const RankCoordinates& c) const {
  if (c.tp_rank < 0 || c.tp_rank >= tp_ || c.dp_rank < 0 || c.dp_rank >= dp_ || c.pp_rank < 0 || c.pp_rank >= pp_) {
    DUFU_FAIL("coordinates (tp ", c.tp_rank, ", dp ", c.dp_rank, ", pp ", c.pp_rank, ") are outside tp ", tp_,
              " x dp ", dp_, " x pp ", pp_);
  }
  return c.pp_rank * (tp_ * dp_) + c.dp_rank * tp_ + c.tp_rank;
}

std::vector<int> Topology::group(ParallelGroup kind) const {
  std::vector<int> ranks;
  RankCoordinates member = coordinates_;
  switch (kind) {
    case ParallelGroup::kTensor:
      for (member.tp_rank = 0; member.tp_rank < tp_; ++member.tp_rank) ranks.push_back(rank_of(member));
      break;
    case ParallelGroup::kData:
      for (member.dp_rank = 0; member.dp_rank < dp_; ++member.dp_rank) ranks.push_back(rank_of(member));
      break;
    case ParallelGroup::kPipeline:
      for (member.pp_rank = 0; member.pp_rank < pp_; ++member.pp_rank) ranks.push_back(rank_of(member));
      break;
    case ParallelGroup::kEmbedding:
      if (!is_first_stage() && !is_last_stage()) break;
      member.pp_rank = 0;
      ranks.push_back(rank_of(member));
      if (pp_ > 1) {
        member.pp_rank = pp_ - 1;
        ranks.push_back(rank_of(member));
      }
      break;
  }
  return ranks;
}

std::optional<int> Topology::previous_stage_rank() const {
  if (is_first_stage()) return std::nullopt;
  RankCoordinates previous = coordinates_;
  --previous.pp_rank;
  return rank_of(previous);
}

std::optional<int> Topology::next_stage_rank() const {
  if (is_last_stage()) return std::nullopt;
  RankCoordinates next = coordinates_;
  ++next.pp_rank;
  return rank_of(next);
}

std::string Topology::describe() const {
  std::string text = str_cat("world ", world_size_, " = tp ", tp_, " x dp ", dp_, " x pp ", pp_, "; rank ", rank_,
                             " is tp ", coordinates_.tp_rank, ", dp ", coordinates_.dp_rank, ", pp ",
                             coordinates_.pp_rank);
  for (ParallelGroup kind : {ParallelGroup::kTensor, ParallelGroup::kData, ParallelGroup::kPipeline,
                             ParallelGroup::kEmbedding}) {
    const std::vector<int> ranks = group(kind);
    text += str_cat(kind == ParallelGroup::kTensor ? "; " : ", ", parallel_group_name(kind), " group ",
                    ranks.empty() ? std::string("none") : rank_list(ranks));
  }
  return text;
}

}  // namespace dufu
