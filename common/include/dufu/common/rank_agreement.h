// Whether the ranks of a job were started alike. Under mpirun or srun every rank
// parses its own command line and opens its own files: an MPMD command line, or a
// path that names different files on different nodes (node-local copies of a
// tokenizer), gives ranks that each write or train on something else, and their
// pieces would be joined into one corrupt result. So before anything is written the
// ranks compare every setting that decides the result, and a difference stops the job.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"

namespace dufu {

// Thrown on every rank of a job by a check that every rank fails alike (so none is
// left waiting for another), such as rank_disagreement: only the rank whose report()
// is true (rank 0) prints it.
class RanksStopped : public Error {
 public:
  RanksStopped(const std::string& message, bool report) : Error(message), report_(report) {}
  bool report() const { return report_; }

 private:
  bool report_;
};

// One setting every rank must have alike. `name` is how the user gives it
// ("--dtype", "train.steps"); `value` is what is compared; `note` is only shown
// (the path of a file compared by its digest, which may differ between nodes).
struct AgreedSetting {
  std::string name;
  std::string value;
  std::string note;
};

// Collective over `world` (every rank calls it with its own settings, in the same
// order of names): nullopt when every rank has the same names and values; else one
// line, the same on every rank, naming the first setting in which the lowest
// differing rank differs from rank 0, both values, and every rank that differs.
std::optional<std::string> rank_disagreement(Communicator& world, const std::vector<AgreedSetting>& settings);

}  // namespace dufu
