// The CUDA embedding backward's buckets (llm.c's way, on the device): each position
// gets a key, its token's row in the local vocabulary (or kNoBucket when a
// vocab-parallel rank does not own the token); a stable sort by key puts the
// positions of one token together in position order; then one block per bucket adds
// the bucket's rows of dout to its dwte row, one thread per channel, in that order.
// Every dwte value is thus the same chain of additions as a plain loop over positions
// (dwte += dout[n] for n = 0, 1, ...): the bits of the CPU device, on every run, with
// no atomics. Host and device (DUFU_HOST_DEVICE), so the CPU tests check these
// functions against that loop.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/kernel_math.h"

namespace dufu::trainer {

// The key of a token no bucket takes (outside [vocab_begin, vocab_end)); it sorts last.
inline constexpr std::int32_t kNoBucket = 0x7fffffff;
// Bits the sort looks at: all 32 (cub orders the signed keys by flipping the sign bit;
// every key here is non-negative, so the order is the keys' order).
inline constexpr int kEmbeddingKeyBits = 32;

DUFU_HOST_DEVICE constexpr std::int32_t embedding_bucket_key(std::int32_t token, int vocab_begin, int vocab_end) {
  return token >= vocab_begin && token < vocab_end ? token - vocab_begin : kNoBucket;
}

// Whether sorted position i opens a bucket: the first of its key, and a key that is one.
DUFU_HOST_DEVICE constexpr bool opens_bucket(const std::int32_t* sorted_keys, int i) {
  return sorted_keys[i] != kNoBucket && (i == 0 || sorted_keys[i - 1] != sorted_keys[i]);
}

// Channel c of the bucket opened at sorted position `first` (of N): its dwte value
// `start` plus the bucket's dout rows in sorted (position) order.
DUFU_HOST_DEVICE inline float sum_bucket_channel(float start, const float* dout, const std::int32_t* sorted_keys,
                                                 const std::int32_t* sorted_positions, int first, int N, int C,
                                                 int c) {
  const std::int32_t key = sorted_keys[first];
  float sum = start;
  for (int i = first; i < N && sorted_keys[i] == key; ++i) {
    sum += dout[static_cast<std::size_t>(sorted_positions[i]) * static_cast<std::size_t>(C) + c];
  }
  return sum;
}

// The scratch of one embedding backward over N positions: two arrays of keys and two
// of positions (cub's double buffers: the sort moves between them), then the sort's
// own temporary storage (histograms and look-back counters, some kilobytes at these
// sizes), which cub asks for at run time; the module checks the request against
// kEmbeddingSortTemporaryBytes, which the memory plan (cuda_scratch.h) holds.
inline constexpr std::size_t kEmbeddingSortTemporaryBytes = std::size_t{1} << 20;
constexpr std::size_t embedding_bucket_arrays_bytes(std::size_t N) {
  const std::size_t array = (N * sizeof(std::int32_t) + 255) / 256 * 256;  // each on 256 bytes
  return 4 * array;
}
constexpr std::size_t embedding_backward_scratch_bytes(std::size_t N) {
  return embedding_bucket_arrays_bytes(N) + kEmbeddingSortTemporaryBytes;
}

}  // namespace dufu::trainer
