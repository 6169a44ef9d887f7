// The data-parallel gradient all-reduce in buckets (train.dp_bucket_mb) against one
// all-reduce of the whole gradient, on the MPI backend, under mpirun:
//   mpirun -np 2 build/benchmarks/dp_bucket_benchmark [--floats N] [--repeats R]
// The program first checks that every bucket size gives the one-bucket sum bit for
// bit, then reports per bucket size the median time, the bus GB/s a ring all-reduce
// would move (2 (n-1)/n of the buffer) and the ratio to one bucket measured in the
// same run (below 1: the bucketed reduction is slower).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"

namespace {

using dufu::Communicator;

void reduce_in_buckets(Communicator& world, std::span<float> gradient, std::size_t bucket_elements) {
  for (const auto& [begin, end] : dufu::trainer::gradient_buckets(gradient.size(), bucket_elements)) {
    world.all_reduce(gradient.subspan(begin, end - begin));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bucketed data-parallel all-reduce against one bucket"};
  std::size_t floats = std::size_t{16} << 20;
  int repeats = 7;
  app.add_option("--floats", floats, "Gradient floats per rank (default 16M, 64 MB)");
  app.add_option("--repeats", repeats, "Timed repeats per bucket size (median reported)");
  CLI11_PARSE(app, argc, argv);

  const std::unique_ptr<Communicator> world = dufu::make_communicator();
  std::mt19937 engine(static_cast<std::uint32_t>(world->rank() + 1));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> input(floats);
  for (float& x : input) x = uniform(engine);

  const double megabytes_of_one_bucket = static_cast<double>(floats) * sizeof(float) / (1 << 20) + 1.0;
  const double sizes_mb[] = {megabytes_of_one_bucket, 25.0, 4.0, 1.0};
  std::vector<float> reference = input;
  reduce_in_buckets(*world, reference, dufu::trainer::bucket_elements_for(megabytes_of_one_bucket));
  std::vector<float> work(floats);
  double baseline = 0.0;
  for (const double mb : sizes_mb) {
    const std::size_t bucket = dufu::trainer::bucket_elements_for(mb);
    work = input;
    reduce_in_buckets(*world, work, bucket);
    if (std::memcmp(work.data(), reference.data(), floats * sizeof(float)) != 0) {
      std::fprintf(stderr, "buckets of %.3g MiB change the sum\n", mb);
      return 1;
    }
    std::vector<double> seconds;
    for (int r = 0; r < repeats; ++r) {
      work = input;
      world->barrier();
      const auto start = std::chrono::steady_clock::now();
      reduce_in_buckets(*world, work, bucket);
      world->barrier();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    if (baseline == 0.0) baseline = median;
    const double n = world->size();
    const double bus_gb_per_s = 2.0 * (n - 1) / n * static_cast<double>(floats) * sizeof(float) / median / 1e9;
    if (world->rank() == 0) {
      std::printf("buckets of %8.2f MiB (%4zu collectives): %8.2f ms, %6.2f GB/s bus, %.2fx one bucket's speed\n", mb,
                  dufu::trainer::gradient_buckets(floats, bucket).size(), median * 1e3, bus_gb_per_s,
                  baseline / median);
    }
  }
  return 0;
}
