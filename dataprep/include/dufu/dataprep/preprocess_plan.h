// How a preprocess job is divided into parts (MPI ranks, or `--shard K/N` jobs): by
// input bytes, in input order. The inputs (in their sorted glob order) are laid end
// to end; the byte axis is cut into N equal intervals. A plain file that an interval
// boundary falls inside is cut there into byte ranges (each owns the lines that start
// in it, line_range_source.h), a Parquet file likewise (each owns the row groups that
// start in it); a compressed file, an Arrow IPC file and a txt file read as one
// document stay whole and go to the part that holds its middle byte. Every part is a
// contiguous run of pieces, so joining the parts in order gives the documents in
// input order: the undivided job's output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/document_reader.h"

namespace dufu::dataprep {

// What the division needs to know of one input.
struct PlanInput {
  std::string path;
  std::uint64_t bytes = 0;  // file size (0 for what is not a regular file)
  bool cuttable = false;    // plain bytes, read line by line
  bool operator==(const PlanInput&) const = default;
};

struct PlanPiece {
  std::size_t input = 0;  // index into PreprocessPlan::inputs
  bool whole = true;
  std::uint64_t begin = 0, end = 0;  // byte range in the file (whole: 0 and its size)
  int part = 0;
  bool operator==(const PlanPiece&) const = default;
};

struct PreprocessPlan {
  int parts = 1;
  std::vector<PlanInput> inputs;
  std::vector<PlanPiece> pieces;  // in input order; their parts never decrease

  // The reader inputs of one part, in order.
  std::vector<InputRange> part_inputs(int part) const;
  std::uint64_t part_bytes(int part) const;
  // A canonical text of the inputs (what the division is a function of), to send to
  // other ranks and to fingerprint a job.
  std::string inputs_text() const;
};

// The pure division: `inputs` in order, `parts` >= 1.
PreprocessPlan divide_inputs(std::vector<PlanInput> inputs, int parts);
std::vector<PlanInput> parse_plan_inputs(const std::string& text);  // inverse of inputs_text()

// Looks at the (already expanded) files: sizes, and for those big enough to be cut,
// whether they are compressed. Refuses "-" (stdin cannot be divided).
std::vector<PlanInput> describe_inputs(const std::vector<std::string>& paths, const ReaderOptions& reader, int parts);

}  // namespace dufu::dataprep
