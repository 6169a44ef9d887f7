// Uploads that return before their copy has run. CUDA copies from pageable host memory
// only after the stream has drained, so an upload of a step's tokens would make the
// host wait for the previous micro-batch's backward. Instead the bytes go into one of
// a few pinned blocks, taken in turn, and the copy from there is queued on the stream;
// a block is reused once the copy queued from it last has run (its event), which the
// host waits for only when the device is kBlocks uploads behind. Host logic over a
// backend (the CUDA calls in cuda_device.cu, a simulated stream in the CPU tests).
#pragma once

#include <array>
#include <cstddef>
#include <cstring>

namespace dufu::trainer::cuda {

// Larger uploads (weights, checkpoints) wait as before: the blocks keep the size of the
// largest upload they took, so the ring pins at most 4 x 4 MiB (a micro-batch of
// 64 x 4096 tokens is 1 MiB).
inline constexpr std::size_t kStagedUploadLimitBytes = std::size_t{4} << 20;

// Backend: Event; void* allocate_pinned(bytes); void free_pinned(void*);
// Event make_event(); void destroy_event(Event); void copy_async(device, pinned,
// bytes) queued on the stream; void record(Event) after it; void wait(Event) until the
// stream has passed it (at once if nothing was recorded on it).
template <typename Backend>
class UploadRing {
 public:
  static constexpr std::size_t kBlocks = 4;

  explicit UploadRing(Backend& backend) : backend_(backend) {}
  ~UploadRing() {
    for (Block& block : blocks_) {
      if (!block.made) continue;
      backend_.wait(block.event);
      backend_.free_pinned(block.pinned);
      backend_.destroy_event(block.event);
    }
  }
  UploadRing(const UploadRing&) = delete;
  UploadRing& operator=(const UploadRing&) = delete;

  // Whether upload() takes `bytes` (else the caller copies and waits).
  static bool takes(std::size_t bytes) { return bytes > 0 && bytes <= kStagedUploadLimitBytes; }

  // Copies `bytes` of `host` now and queues their copy to `device`: `host` may be
  // reused when this returns.
  void upload(void* device, const void* host, std::size_t bytes) {
    Block& block = blocks_[next_];
    next_ = (next_ + 1) % kBlocks;
    if (!block.made) {
      block.event = backend_.make_event();
      block.made = true;
    }
    backend_.wait(block.event);
    if (block.capacity < bytes) {
      if (block.pinned != nullptr) backend_.free_pinned(block.pinned);
      block.pinned = nullptr;
      block.capacity = 0;
      block.pinned = backend_.allocate_pinned(bytes);
      block.capacity = bytes;
    }
    std::memcpy(block.pinned, host, bytes);
    backend_.copy_async(device, block.pinned, bytes);
    backend_.record(block.event);
  }

 private:
  struct Block {
    void* pinned = nullptr;
    std::size_t capacity = 0;
    typename Backend::Event event{};
    bool made = false;
  };
  Backend& backend_;
  std::array<Block, kBlocks> blocks_{};
  std::size_t next_ = 0;
};

}  // namespace dufu::trainer::cuda
