#include "init/nvml_state.hpp"

#include <string>
#include <vector>

#include "common/sysfs.hpp"
#include "common/text.hpp"

namespace pod_init {

const char* fabric_state_name(FabricState state) {
  switch (state) {
    case FabricState::NotSupported:
      return "not-supported";
    case FabricState::NotStarted:
      return "not-started";
    case FabricState::InProgress:
      return "in-progress";
    case FabricState::Completed:
      return "completed";
    case FabricState::Unknown:
      break;
  }
  return "unknown";
}

bool fabric_ready(const GpuNvmlState& state) {
  return (state.fabric == FabricState::Completed && state.fabric_status == 0) ||
         state.fabric == FabricState::NotSupported;
}

std::string format_gpu_state(const GpuNvmlState& state) {
  std::string line = "gpu " + state.bdf + " persistence=" +
                     (state.persistence < 0 ? "unknown"
                      : state.persistence   ? "on"
                                            : "off") +
                     " fabric=" + fabric_state_name(state.fabric) +
                     " fabric_status=" + std::to_string(state.fabric_status) +
                     " sm=" + std::to_string(state.details.sm) + " nvlinks=";
  for (size_t i = 0; i < state.details.nvlinks.size(); ++i) {
    const NvLinkGroup& group = state.details.nvlinks[i];
    line += (i ? "," : "") + group.target + "*" + std::to_string(group.count);
  }
  return line;
}

bool parse_gpu_state(std::string_view line, GpuNvmlState* state) {
  std::vector<std::string> words = split_on(line, ' ');
  if (words.size() != 7 || words[0] != "gpu" || !sysfs::is_bdf(words[1])) return false;
  GpuNvmlState parsed;
  parsed.bdf = words[1];
  for (size_t i = 2; i < words.size(); ++i) {
    size_t equals = words[i].find('=');
    if (equals == std::string::npos) return false;
    std::string key = words[i].substr(0, equals), value = words[i].substr(equals + 1);
    if (key == "persistence") {
      if (value != "on" && value != "off" && value != "unknown") return false;
      parsed.persistence = value == "unknown" ? -1 : value == "on";
    } else if (key == "fabric") {
      bool known = false;
      for (FabricState s :
           {FabricState::Unknown, FabricState::NotSupported, FabricState::NotStarted,
            FabricState::InProgress, FabricState::Completed}) {
        if (value == fabric_state_name(s)) {
          parsed.fabric = s;
          known = true;
        }
      }
      if (!known) return false;
    } else if (key == "fabric_status" || key == "sm") {
      auto number = sysfs::parse_int(value);
      if (!number || *number < 0 || *number > 1000000) return false;
      (key == "sm" ? parsed.details.sm : parsed.fabric_status) = static_cast<int>(*number);
    } else if (key == "nvlinks") {
      for (const std::string& group : split_on(value, ',')) {
        size_t star = group.find('*');
        if (star == std::string::npos) return false;
        std::string target(group.substr(0, star));
        auto count = sysfs::parse_int(group.substr(star + 1));
        if (!count || *count <= 0 || *count > 64) return false;
        if (target != kNvSwitchTarget && !sysfs::is_bdf(target)) return false;
        NvLinkPeer peer = target == kNvSwitchTarget ? NvLinkPeer::Switch : NvLinkPeer::Gpu;
        parsed.details.nvlinks.push_back({target, peer, static_cast<int>(*count)});
      }
    } else {
      return false;
    }
  }
  *state = std::move(parsed);
  return true;
}

}  // namespace pod_init
