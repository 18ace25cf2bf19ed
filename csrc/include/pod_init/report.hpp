// Rendering a Topology: the JSON document that `pod-init topo --json` prints
// and Python parses, and the human matrix in the style of `nvidia-smi topo -m`.
#pragma once

#include <string>

#include "pod_init/topology.hpp"

namespace pod_init {

std::string topology_json(const Topology& topo);
std::string topology_text(const Topology& topo);

}  // namespace pod_init
