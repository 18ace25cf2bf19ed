// The clocks the core reads: monotonic for durations, boot time for the
// stamps PID 1 logs (it counts suspended time too, as dmesg does).
#pragma once

#include <time.h>

#include <cstdint>

namespace pod_init {

inline uint64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

inline uint64_t monotonic_ns() { return clock_ns(CLOCK_MONOTONIC); }
inline uint64_t monotonic_ms() { return monotonic_ns() / 1000000u; }
inline uint64_t boottime_ns() { return clock_ns(CLOCK_BOOTTIME); }

}  // namespace pod_init
