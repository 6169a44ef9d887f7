// The CUDA device's staged uploads (src/cuda/upload_ring.h) over a simulated stream
// that runs its queued copies only when something waits for them, as a GPU busy with a
// step's kernels would: the host's bytes must arrive even though the host reuses its
// buffer at once, a pinned block must never be freed or rewritten under a copy not yet
// run, and the host must wait only when the device is a whole ring behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/upload_ring.h"

namespace dufu::trainer::cuda {
namespace {

class SimulatedStream {
 public:
  using Event = std::size_t;

  void* allocate_pinned(std::size_t bytes) {
    blocks_.push_back(std::make_unique<std::byte[]>(bytes));
    ++allocations;
    return blocks_.back().get();
  }
  void free_pinned(void* memory) {
    EXPECT_FALSE(pending_from(memory)) << "a pinned block freed under a copy not yet run";
    std::erase_if(blocks_, [&](const auto& block) { return block.get() == memory; });
  }
  Event make_event() {
    event_positions_.push_back(0);
    return event_positions_.size() - 1;
  }
  void destroy_event(Event /*event*/) {}
  void copy_async(void* device, const void* pinned, std::size_t bytes) {
    // What the block holds now must still be there when the copy runs.
    queued_.push_back({device, pinned, bytes, std::vector<std::byte>(static_cast<const std::byte*>(pinned),
                                                                     static_cast<const std::byte*>(pinned) + bytes)});
  }
  void record(Event event) { event_positions_[event] = queued_.size(); }
  void wait(Event event) {
    if (ran_ < event_positions_[event]) {
      ++blocking_waits;
      run_until(event_positions_[event]);
    }
  }
  // The device catches up with everything queued.
  void drain() { run_until(queued_.size()); }
  std::size_t live_blocks() const { return blocks_.size(); }

  int allocations = 0;
  int blocking_waits = 0;

 private:
  struct Copy {
    void* device;
    const void* pinned;
    std::size_t bytes;
    std::vector<std::byte> when_queued;
  };
  bool pending_from(const void* memory) const {
    return std::any_of(queued_.begin() + static_cast<std::ptrdiff_t>(ran_), queued_.end(),
                       [&](const Copy& copy) { return copy.pinned == memory; });
  }
  void run_until(std::size_t end) {
    for (; ran_ < end; ++ran_) {
      const Copy& copy = queued_[ran_];
      EXPECT_EQ(0, std::memcmp(copy.pinned, copy.when_queued.data(), copy.bytes))
          << "copy " << ran_ << ": its pinned block was rewritten before it ran";
      std::memcpy(copy.device, copy.pinned, copy.bytes);
    }
  }
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::vector<std::size_t> event_positions_;
  std::vector<Copy> queued_;
  std::size_t ran_ = 0;
};

std::vector<std::int32_t> batch_of(int index, std::size_t size) {
  std::vector<std::int32_t> batch(size);
  for (std::size_t i = 0; i < size; ++i) batch[i] = static_cast<std::int32_t>(index * 1000 + static_cast<int>(i));
  return batch;
}

// A device that runs nothing until the host has queued ten uploads from one host
// buffer, rewritten after each: every destination gets its own batch, and the host
// waited only for the uploads a whole ring back (the 5th to the 10th).
TEST(UploadRing, HostBufferReusedAtOnceWhileTheDeviceLags) {
  SimulatedStream stream;
  std::vector<std::vector<std::int32_t>> destinations(10, std::vector<std::int32_t>(64, -1));
  {
    UploadRing<SimulatedStream> ring(stream);
    std::vector<std::int32_t> host(64);
    for (int i = 0; i < 10; ++i) {
      host = batch_of(i, 64);
      ring.upload(destinations[static_cast<std::size_t>(i)].data(), host.data(), host.size() * sizeof(std::int32_t));
      std::fill(host.begin(), host.end(), -7);  // reused as soon as upload returns
    }
    EXPECT_EQ(stream.blocking_waits, 10 - static_cast<int>(UploadRing<SimulatedStream>::kBlocks));
    stream.drain();
  }
  for (int i = 0; i < 10; ++i) EXPECT_EQ(destinations[static_cast<std::size_t>(i)], batch_of(i, 64)) << i;
  EXPECT_EQ(stream.live_blocks(), 0U) << "the ring frees its blocks";
}

// A device that keeps up: no wait at all, and one block per ring slot however many
// uploads of the same size.
TEST(UploadRing, NoWaitWhenTheDeviceKeepsUp) {
  SimulatedStream stream;
  UploadRing<SimulatedStream> ring(stream);
  std::vector<std::int32_t> destination(32);
  for (int i = 0; i < 100; ++i) {
    const std::vector<std::int32_t> host = batch_of(i, 32);
    ring.upload(destination.data(), host.data(), host.size() * sizeof(std::int32_t));
    stream.drain();
    ASSERT_EQ(destination, host);
  }
  EXPECT_EQ(stream.blocking_waits, 0);
  EXPECT_EQ(stream.allocations, static_cast<int>(UploadRing<SimulatedStream>::kBlocks));
}

// A larger upload grows its block only after the copy queued from it has run (the
// simulated stream fails a free under a pending copy).
TEST(UploadRing, ABlockGrowsOnlyAfterItsCopyRan) {
  SimulatedStream stream;
  UploadRing<SimulatedStream> ring(stream);
  std::vector<std::vector<std::int32_t>> destinations;
  for (std::size_t i = 0; i < 9; ++i) destinations.emplace_back(8 * (i + 1), -1);
  for (std::size_t i = 0; i < 9; ++i) {
    const std::vector<std::int32_t> host = batch_of(static_cast<int>(i), destinations[i].size());
    ring.upload(destinations[i].data(), host.data(), host.size() * sizeof(std::int32_t));
  }
  stream.drain();
  for (std::size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(destinations[i], batch_of(static_cast<int>(i), destinations[i].size())) << i;
  }
  EXPECT_EQ(stream.allocations, 9);
  EXPECT_EQ(stream.live_blocks(), UploadRing<SimulatedStream>::kBlocks);
}

TEST(UploadRing, TakesSmallUploadsOnly) {
  EXPECT_FALSE(UploadRing<SimulatedStream>::takes(0));
  EXPECT_TRUE(UploadRing<SimulatedStream>::takes(1));
  EXPECT_TRUE(UploadRing<SimulatedStream>::takes(kStagedUploadLimitBytes));
  EXPECT_FALSE(UploadRing<SimulatedStream>::takes(kStagedUploadLimitBytes + 1));
}

}  // namespace
}  // namespace dufu::trainer::cuda
