#include "nccl/detail/rings.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

namespace pod_init {

namespace {

// Crossings folded into one number for the subset search. Each count is at
// most kExactRingLimit, so the weights keep the SYS > NODE > PHB order.
constexpr int64_t kSysWeight = 10000, kNodeWeight = 100, kPhbWeight = 1;
constexpr int64_t kUnreachable = std::numeric_limits<int64_t>::max() / 4;

int64_t crossing_weight(const RingHop& hop) {
  if (hop.nvlinks > 0) return 0;
  switch (hop.level) {
    case Level::Sys:
      return kSysWeight;
    case Level::Node:
      return kNodeWeight;
    case Level::Phb:
      return kPhbWeight;
    default:
      return 0;
  }
}

// Held-Karp over subsets, using only hops of at least `floor` GB/s: the
// order with the least crossing weight, or an empty order when none closes.
std::vector<int> cheapest_ring(const HopMatrix& hops, double floor) {
  const int n = static_cast<int>(hops.size());
  const size_t full = size_t{1} << n;
  std::vector<int64_t> cost(full * n, kUnreachable);
  std::vector<int8_t> previous(full * n, -1);
  cost[1 * n + 0] = 0;  // GPU 0 starts every ring; rotation changes nothing
  for (size_t set = 1; set < full; set += 2) {
    for (int last = 0; last < n; ++last) {
      int64_t here = cost[set * n + last];
      if (here >= kUnreachable) continue;
      for (int next = 1; next < n; ++next) {
        if (set & (size_t{1} << next)) continue;
        const RingHop& hop = hops[last][next];
        if (hop.bandwidth_gbs < floor) continue;
        size_t grown = set | (size_t{1} << next);
        int64_t total = here + crossing_weight(hop);
        if (total < cost[grown * n + next]) {
          cost[grown * n + next] = total;
          previous[grown * n + next] = static_cast<int8_t>(last);
        }
      }
    }
  }
  int best_last = -1;
  int64_t best = kUnreachable;
  for (int last = 1; last < n; ++last) {
    const RingHop& closing = hops[last][0];
    int64_t here = cost[(full - 1) * n + last];
    if (here >= kUnreachable || closing.bandwidth_gbs < floor) continue;
    if (here + crossing_weight(closing) < best) {
      best = here + crossing_weight(closing);
      best_last = last;
    }
  }
  if (best_last < 0) return {};
  std::vector<int> order;
  size_t set = full - 1;
  for (int at = best_last; at >= 0;) {
    order.push_back(at);
    int before = previous[set * n + at];
    set &= ~(size_t{1} << at);
    at = at == 0 ? -1 : before;
  }
  std::reverse(order.begin(), order.end());
  return order;
}

RingPlan exact_ring(const HopMatrix& hops) {
  // The best bottleneck is one of the hop bandwidths: take the largest for
  // which a ring still closes, then the cheapest ring at that floor.
  std::vector<double> floors;
  for (const auto& row : hops) {
    for (const RingHop& hop : row) floors.push_back(hop.bandwidth_gbs);
  }
  std::sort(floors.begin(), floors.end());
  floors.erase(std::unique(floors.begin(), floors.end()), floors.end());
  size_t low = 0, high = floors.size();  // answer in [low, high)
  std::vector<int> best = cheapest_ring(hops, floors.front());
  while (high - low > 1) {
    size_t mid = (low + high) / 2;
    std::vector<int> order = cheapest_ring(hops, floors[mid]);
    if (order.empty()) {
      high = mid;
    } else {
      low = mid;
      best = std::move(order);
    }
  }
  return {best, ring_cost(hops, best), true};
}

}  // namespace

RingPlan plan_ring_heuristic(const HopMatrix& hops) {
  const int n = static_cast<int>(hops.size());
  RingPlan best;
  for (int start = 0; start < n; ++start) {
    std::vector<int> order = {start};
    std::vector<bool> used(n, false);
    used[start] = true;
    while (static_cast<int>(order.size()) < n) {
      int from = order.back(), pick = -1;
      for (int to = 0; to < n; ++to) {
        if (used[to]) continue;
        const RingHop& hop = hops[from][to];
        if (pick < 0 || hop.bandwidth_gbs > hops[from][pick].bandwidth_gbs ||
            (hop.bandwidth_gbs == hops[from][pick].bandwidth_gbs &&
             crossing_weight(hop) < crossing_weight(hops[from][pick]))) {
          pick = to;
        }
      }
      used[pick] = true;
      order.push_back(pick);
    }
    // 2-opt: reverse a stretch while that improves the ring.
    RingCost cost = ring_cost(hops, order);
    for (bool improved = true; improved;) {
      improved = false;
      for (int i = 1; i < n - 1; ++i) {
        for (int j = i + 1; j < n; ++j) {
          std::reverse(order.begin() + i, order.begin() + j + 1);
          RingCost trial = ring_cost(hops, order);
          if (trial.better_than(cost)) {
            cost = trial;
            improved = true;
          } else {
            std::reverse(order.begin() + i, order.begin() + j + 1);
          }
        }
      }
    }
    if (best.order.empty() || cost.better_than(best.cost)) best = {order, cost, false};
  }
  // Same rotation as the exact search, for stable output.
  auto zero = std::find(best.order.begin(), best.order.end(), 0);
  std::rotate(best.order.begin(), zero, best.order.end());
  return best;
}

bool RingCost::better_than(const RingCost& other) const {
  if (bottleneck_gbs != other.bottleneck_gbs) return bottleneck_gbs > other.bottleneck_gbs;
  if (sys != other.sys) return sys < other.sys;
  if (node != other.node) return node < other.node;
  return phb < other.phb;
}

bool RingCost::operator==(const RingCost& other) const {
  return !better_than(other) && !other.better_than(*this);
}

RingCost ring_cost(const HopMatrix& hops, const std::vector<int>& order) {
  RingCost cost;
  cost.bottleneck_gbs = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < order.size(); ++i) {
    const RingHop& hop = hops[order[i]][order[(i + 1) % order.size()]];
    cost.bottleneck_gbs = std::min(cost.bottleneck_gbs, hop.bandwidth_gbs);
    if (hop.nvlinks > 0) continue;
    cost.sys += hop.level == Level::Sys;
    cost.node += hop.level == Level::Node;
    cost.phb += hop.level == Level::Phb;
  }
  return cost;
}

RingPlan plan_ring(const HopMatrix& hops) {
  if (hops.size() <= 1) {
    std::vector<int> order(hops.size(), 0);
    return {order, RingCost{}, true};
  }
  return static_cast<int>(hops.size()) <= kExactRingLimit ? exact_ring(hops)
                                                          : plan_ring_heuristic(hops);
}

RingPlan plan_ring_brute_force(const HopMatrix& hops) {
  std::vector<int> order(hops.size());
  std::iota(order.begin(), order.end(), 0);
  RingPlan best{order, ring_cost(hops, order), true};
  if (order.size() <= 1) return best;
  while (std::next_permutation(order.begin() + 1, order.end())) {
    RingCost cost = ring_cost(hops, order);
    if (cost.better_than(best.cost)) best = {order, cost, true};
  }
  return best;
}

double pcie_link_gbs(double speed_gts, int width) {
  // 8b/10b up to 5 GT/s, 128b/130b for Gen3-5, FLIT mode (242/256) for Gen6.
  double efficiency = speed_gts <= 5.0 ? 0.8 : speed_gts <= 32.0 ? 128.0 / 130.0 : 242.0 / 256.0;
  return speed_gts * efficiency * width / 8.0;
}

HopMatrix gpu_hops(const Topology& topo, const GpuDetailsMap& details) {
  std::vector<const PciDevice*> gpus;
  for (const PciDevice& dev : topo.devices) {
    if (dev.kind == DeviceKind::Gpu) gpus.push_back(&dev);
  }
  DeviceIndex index = index_by_bdf(topo.devices);
  auto link_gbs = [&](const PciDevice& gpu) {
    LinkCapability link = link_capability(gpu, index);
    return link.speed_gts > 0 && link.width > 0 ? pcie_link_gbs(link.speed_gts, link.width) : 0.0;
  };
  auto detail = [&](const PciDevice& gpu) -> const GpuDetails* {
    auto found = details.find(gpu.bdf);
    return found == details.end() ? nullptr : &found->second;
  };
  HopMatrix hops(gpus.size(), std::vector<RingHop>(gpus.size()));
  for (size_t a = 0; a < gpus.size(); ++a) {
    for (size_t b = 0; b < gpus.size(); ++b) {
      RingHop& hop = hops[a][b];
      hop.level = classify(*gpus[a], *gpus[b], index);
      hop.bandwidth_gbs = std::min(link_gbs(*gpus[a]), link_gbs(*gpus[b]));
      const GpuDetails* da = detail(*gpus[a]);
      const GpuDetails* db = detail(*gpus[b]);
      hop.nvlinks = nvlinks_between(gpus[a]->bdf, da, gpus[b]->bdf, db);
      if (hop.nvlinks > 0) hop.bandwidth_gbs = hop.nvlinks * std::min(da->link_gbs, db->link_gbs);
    }
  }
  return hops;
}

std::vector<RailCut> rail_cuts(const std::vector<int>& order,
                               const std::vector<std::vector<Level>>& gpu_to_nic) {
  std::vector<RailCut> cuts;
  size_t nics = gpu_to_nic.empty() ? 0 : gpu_to_nic.front().size();
  size_t n = order.size();
  for (size_t nic = 0; nic < nics && n > 0; ++nic) {
    size_t best = 0;
    std::pair<int, int> best_key{1 << 30, 1 << 30};
    for (size_t cut = 0; cut < n; ++cut) {
      // The ring starts right after the cut and ends at the cut.
      int first = static_cast<int>(gpu_to_nic[order[(cut + 1) % n]][nic]);
      int last = static_cast<int>(gpu_to_nic[order[cut]][nic]);
      std::pair<int, int> key{std::max(first, last), first + last};
      if (key < best_key) best_key = key, best = cut;
    }
    RailCut rail{static_cast<int>(nic), {}, static_cast<Level>(best_key.first)};
    for (size_t i = 1; i <= n; ++i) rail.order.push_back(order[(best + i) % n]);
    cuts.push_back(rail);
  }
  return cuts;
}

}  // namespace pod_init
