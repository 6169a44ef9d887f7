#include "dufu/trainer/device/memory_limit.h"

#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <algorithm>

namespace dufu::trainer {

double memory_limit_bytes() {
  struct sysinfo info {};
  double limit = 0.0;
  if (::sysinfo(&info) == 0) {
    limit = (static_cast<double>(info.totalram) + static_cast<double>(info.totalswap)) * info.mem_unit;
  }
  if (limit <= 0.0) return 1e300;  // unknown: nothing is refused up front
  for (const int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit rlimit {};
    if (::getrlimit(resource, &rlimit) == 0 && rlimit.rlim_cur != RLIM_INFINITY) {
      limit = std::min(limit, static_cast<double>(rlimit.rlim_cur));
    }
  }
  return limit;
}

}  // namespace dufu::trainer
