#include "topology/nvlink.hpp"

#include <algorithm>

namespace pod_init {

namespace {

int links_to(const GpuDetails& gpu, NvLinkPeer peer, const std::string& target) {
  int count = 0;
  for (const NvLinkGroup& group : gpu.nvlinks) {
    if (group.peer == peer && (peer == NvLinkPeer::Switch || group.target == target)) {
      count += group.count;
    }
  }
  return count;
}

}  // namespace

int nvlinks_between(const std::string& a_bdf, const GpuDetails* a, const std::string& b_bdf,
                    const GpuDetails* b) {
  if (a == nullptr || b == nullptr || a_bdf == b_bdf) return 0;
  int direct = std::max(links_to(*a, NvLinkPeer::Gpu, b_bdf), links_to(*b, NvLinkPeer::Gpu, a_bdf));
  int switched =
      std::min(links_to(*a, NvLinkPeer::Switch, ""), links_to(*b, NvLinkPeer::Switch, ""));
  return direct + switched;
}

void merge_nvlinks(Topology* topo, const GpuDetailsMap& details) {
  Matrix& matrix = topo->matrix;
  size_t n = matrix.members.size();
  matrix.nvlinks.assign(n, std::vector<int>(n, 0));
  auto lookup = [&](const PciDevice& dev) -> const GpuDetails* {
    if (dev.kind != DeviceKind::Gpu) return nullptr;
    auto found = details.find(dev.bdf);
    return found == details.end() ? nullptr : &found->second;
  };
  for (size_t r = 0; r < n; ++r) {
    const PciDevice& a = topo->devices[matrix.members[r]];
    for (size_t c = 0; c < n; ++c) {
      const PciDevice& b = topo->devices[matrix.members[c]];
      matrix.nvlinks[r][c] = nvlinks_between(a.bdf, lookup(a), b.bdf, lookup(b));
    }
  }
}

}  // namespace pod_init
