// One AdamW launch over all parameters (the CUDA device's adamw_update): the weight-
// decay segments travel in the kernel's parameters (PyTorch's multi_tensor_apply does
// the same with its chunk table), so no upload and no host wait precede the launch;
// each thread finds its segment by binary search. A table holds kAdamWTableSegments
// non-empty segments (4 KiB of kernel parameters at most); more take more launches.
// Host and device (DUFU_HOST_DEVICE), so the CPU tests check the segment search and
// the cut into tables against naive loops.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "device/kernel_math.h"
#include "dufu/trainer/device/kernel_table.h"

namespace dufu::trainer {

inline constexpr int kAdamWTableSegments = 192;

// Non-empty segments [begin, end[0]), [end[0], end[1]), ...: the update of each uses
// the step shared by all, with its own decay (1 - lr * weight_decay).
struct AdamWSegmentTable {
  std::size_t begin = 0;
  int count = 0;
  std::size_t end[kAdamWTableSegments] = {};
  float decay[kAdamWTableSegments] = {};
};

// The segment of parameter i (table.begin <= i < table.end[table.count - 1]): the first
// whose end is above i.
DUFU_HOST_DEVICE inline int adamw_segment_of(const AdamWSegmentTable& table, std::size_t i) {
  int low = 0, high = table.count - 1;
  while (low < high) {
    const int mid = (low + high) / 2;
    if (table.end[mid] > i) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return low;
}

// The tables of one update: adamw_update's segments (ends not decreasing; a segment
// that ends at or before the last end is empty and dropped), cut every
// kAdamWTableSegments, each decay from make_adamw_step so the bits are those of one
// launch per segment.
inline std::vector<AdamWSegmentTable> adamw_segment_tables(std::span<const AdamWSegment> segments, float lr,
                                                           float beta1, float beta2, float eps, int t) {
  std::vector<AdamWSegmentTable> tables;
  std::size_t begin = 0;
  for (const AdamWSegment& segment : segments) {
    if (segment.end <= begin) continue;
    if (tables.empty() || tables.back().count == kAdamWTableSegments) {
      tables.emplace_back();
      tables.back().begin = begin;
    }
    AdamWSegmentTable& table = tables.back();
    table.end[table.count] = segment.end;
    table.decay[table.count] = make_adamw_step(lr, beta1, beta2, eps, segment.weight_decay, t).decay;
    ++table.count;
    begin = segment.end;
  }
  return tables;
}

}  // namespace dufu::trainer
