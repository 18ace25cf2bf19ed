// What a caller of the reader and the writer picks and gets back about the IO
// beneath them: which backend executes it, and the counts of what it issued.
#pragma once

#include <cstdint>

#include "io/latency_histogram.hpp"

namespace pod_init {

// Auto: io_uring where the kernel allows it, else the thread pool.
enum class BackendChoice { Auto, IoUring, Pread };

struct IoCounters {
  uint64_t ios = 0;        // IOs issued to the kernel
  uint64_t fixed_ios = 0;  // of them, through a registered buffer
  LatencyHistogram io_latency;
};

}  // namespace pod_init
