// The math of flash-style causal attention, shared by the CPU kernel (src/cpu/) and the
// CUDA kernel (src/cuda/), so the CPU tests cover the recurrence the GPU runs.
//
// Forward, per query row t, over the key tiles left of the diagonal in order: the
// scaled scores s_j = q_t · k_j / sqrt(hs) of a tile raise the running maximum m to
// max(m, max_j s_j); the output accumulated so far and the running sum l were weighted
// by exp(s - m_old), so both are multiplied by exp(m_old - m_new) (the rescale); then
// the tile adds w_j = exp(s_j - m) to l and w_j v_j to the output. After the last
// tile, out = output / l and the row's log-sum-exp lse = m + log l is all the backward
// keeps: P_tj = exp(s_tj - lse_t) is recomputed tile by tile, never stored.
//
// Backward, with D_t = dout_t · out_t (= sum_j P_tj dP_tj, the softmax backward's row
// term): dP_tj = dout_t · v_j, dS_tj = P_tj (dP_tj - D_t) / sqrt(hs), and
// dq_t = sum_j dS_tj k_j, dk_j = sum_t dS_tj q_t, dv_j = sum_t P_tj dout_t.
//
// With grouped K/V heads (FlashAttentionShape below), a K/V head's dk and dv also sum
// over the query heads of its group: both kernels take the group's heads in order,
// lowest first, each over its query rows in the order above, into one accumulator;
// a group of one head (NKV = NH) is multi-head attention's sum, operation for
// operation.
//
// Document masking (FlashAttentionShape::document_starts): query t also does not see
// the keys before its document's start, so key tiles wholly before the start of a
// query tile's first row are skipped (first_key_tile), and query tiles wholly after a
// key tile's document are not visited (the backward's dk and dv).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "dufu/common/error.h"
#include "device/kernel_math.h"

namespace dufu::trainer {

// Where one head's rows live. qkv [B, T, (NH + 2 NKV) hs]: each row holds the NH query
// heads, then the NKV key heads, then the NKV value heads, hs wide each (the layout
// rotary_forward expects; GPT-2 is NKV = NH). Grouped-query attention: the NH / NKV
// query heads of a group share one K/V head, query head h reading K/V head
// h / (NH / NKV). out and dout [B, T, NH hs]; lse [B, NH, T].
struct FlashAttentionShape {
  int T, NH, NKV, hs;
  // [B, T] where each token's document starts in its row (kernel_table.h); null: 0.
  const std::int32_t* document_starts = nullptr;
  // Rows past T (a tile's padding) start at 0.
  DUFU_HOST_DEVICE int document_start(int b, int t) const {
    return document_starts == nullptr || t >= T ? 0 : document_starts[static_cast<std::size_t>(b) * T + t];
  }
  // Whether query t of sequence b sees key j (both < T).
  DUFU_HOST_DEVICE bool sees(int b, int t, int j) const { return j <= t && j >= document_start(b, t); }
  // The first key tile (tiles of `tile` keys from 0) a query tile starting at row t0
  // needs: the one holding its first row's document start, the earliest of its rows'.
  DUFU_HOST_DEVICE int first_key_tile(int b, int t0, int tile) const { return document_start(b, t0) / tile * tile; }
  DUFU_HOST_DEVICE int group_size() const { return NH / NKV; }
  DUFU_HOST_DEVICE int kv_head(int h) const { return h / group_size(); }
  DUFU_HOST_DEVICE float scale() const { return 1.0f / std::sqrt(static_cast<float>(hs)); }
  DUFU_HOST_DEVICE std::size_t qkv_stride() const { return static_cast<std::size_t>(NH + 2 * NKV) * hs; }
  DUFU_HOST_DEVICE std::size_t out_stride() const { return static_cast<std::size_t>(NH) * hs; }
  // Query head h of sequence b at position t.
  DUFU_HOST_DEVICE std::size_t q_offset(int b, int t, int h) const { return row_offset(b, t) + column(h); }
  // K/V head g (0 .. NKV - 1), not a query head's number: see kv_head.
  DUFU_HOST_DEVICE std::size_t k_offset(int b, int t, int g) const { return row_offset(b, t) + column(NH + g); }
  DUFU_HOST_DEVICE std::size_t v_offset(int b, int t, int g) const {
    return row_offset(b, t) + column(NH + NKV + g);
  }
  // Head h's slice of out (or dout) row (b, t).
  DUFU_HOST_DEVICE std::size_t out_offset(int b, int t, int h) const {
    return (static_cast<std::size_t>(b) * T + t) * out_stride() + column(h);
  }
  DUFU_HOST_DEVICE std::size_t lse_offset(int b, int h, int t) const {
    return (static_cast<std::size_t>(b) * NH + h) * T + t;
  }

 private:
  DUFU_HOST_DEVICE std::size_t row_offset(int b, int t) const {
    return (static_cast<std::size_t>(b) * T + t) * qkv_stride();
  }
  DUFU_HOST_DEVICE std::size_t column(int head) const { return static_cast<std::size_t>(head) * hs; }
};

// Both backends' entry points check this before any launch: a wrong grouping would
// read K/V heads that do not exist.
inline void check_attention_heads(int NH, int NKV) {
  if (NKV < 1 || NH < NKV || NH % NKV != 0) {
    DUFU_FAIL("attention: ", NH, " query heads cannot share ", NKV,
              " K/V heads; HINT: the number of query heads must be a positive multiple of the K/V heads");
  }
}

// The running state of one query row's softmax.
struct OnlineSoftmax {
  float max;  // of the scores seen so far; -inf before the first tile
  float sum;  // of exp(score - max) over the scores seen so far
};

DUFU_HOST_DEVICE inline OnlineSoftmax online_softmax_start() { return {-INFINITY, 0.0f}; }

// Takes a tile whose largest visible score is tile_max (the row must see at least one
// key of the tile): raises the running maximum and returns the factor exp(m_old - m_new)
// by which the output accumulated so far must be multiplied; the running sum is
// multiplied here. The factor is 1 when the maximum does not grow, 0 on the first tile.
DUFU_HOST_DEVICE inline float online_softmax_rescale(OnlineSoftmax& row, float tile_max) {
  if (!(tile_max > row.max)) return 1.0f;
  const float factor = row.max == -INFINITY ? 0.0f : exp_approx(row.max - tile_max);
  row.max = tile_max;
  row.sum *= factor;
  return factor;
}

// The weight of a visible score after online_softmax_rescale took its tile; the caller
// adds the tile's weights to row.sum (a reduction the CPU vectorizes).
DUFU_HOST_DEVICE inline float online_softmax_weight(const OnlineSoftmax& row, float score) {
  return exp_approx(score - row.max);
}

// log sum_j exp(s_j) of the row, after its last tile.
DUFU_HOST_DEVICE inline float online_softmax_lse(const OnlineSoftmax& row) { return row.max + std::log(row.sum); }

// The softmax probability of a scaled score, recomputed from the row's saved lse.
DUFU_HOST_DEVICE inline float flash_probability(float score, float lse) { return exp_approx(score - lse); }

// The gradient of a raw dot product q_t · k_j: P (dP - D) times the scores' scale.
DUFU_HOST_DEVICE inline float flash_score_grad(float probability, float dprobability, float row_dot, float scale) {
  return probability * (dprobability - row_dot) * scale;
}

}  // namespace dufu::trainer
