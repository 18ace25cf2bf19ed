// Rendering a Topology: the JSON document that `pod-init topo --json` prints
// and Python parses, and the human matrix in the style of `nvidia-smi topo -m`.
#pragma once

#include <string>
#include <string_view>

#include "topology/topology.hpp"

namespace pod_init {

std::string topology_json(const Topology& topo);
std::string topology_text(const Topology& topo);

// The Topology that topology_json() described, for a process that reuses a
// scan instead of repeating it (pyinit run after PID 1). topology_json() of
// the result equals the document. InputError naming `source` when the text is
// not such a document.
Topology topology_from_json(std::string_view text, const std::string& source);

}  // namespace pod_init
