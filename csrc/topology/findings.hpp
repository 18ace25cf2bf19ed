// Findings: what the scan noticed, with a stable code that scripts match on.
#pragma once

#include <string>
#include <vector>

namespace pod_init {

enum class Severity { Info, Warning, Error };
const char* severity_name(Severity severity);

struct Finding {
  Severity severity = Severity::Info;
  std::string code;    // stable, e.g. LINK_WIDTH_DEGRADED
  std::string device;  // BDF, or "" for the whole node
  std::string message;
};

namespace finding_code {
inline constexpr const char* kLinkSpeedDegraded = "LINK_SPEED_DEGRADED";
inline constexpr const char* kLinkWidthDegraded = "LINK_WIDTH_DEGRADED";
inline constexpr const char* kBar1Small = "BAR1_SMALL";
inline constexpr const char* kAcsRedirect = "ACS_REDIRECT";
inline constexpr const char* kNumaUnknown = "NUMA_UNKNOWN";
inline constexpr const char* kGpuCountLow = "GPU_COUNT_LOW";
inline constexpr const char* kSysfsUnreadable = "SYSFS_UNREADABLE";
inline constexpr const char* kSysfsMalformed = "SYSFS_MALFORMED";
inline constexpr const char* kSysfsDanglingLink = "SYSFS_DANGLING_LINK";
inline constexpr const char* kConfigUnreadable = "CONFIG_UNREADABLE";
inline constexpr const char* kBar0Denied = "BAR0_DENIED";
inline constexpr const char* kBar0Failed = "BAR0_FAILED";
inline constexpr const char* kGpuNotResponding = "GPU_NOT_RESPONDING";
}  // namespace finding_code

bool has_errors(const std::vector<Finding>& findings);

}  // namespace pod_init
