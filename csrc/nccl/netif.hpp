// Network interfaces as NCCL's socket transport will use them: which one
// carries traffic to the master, and which ones must never be picked.
#pragma once

#include <string>
#include <vector>

namespace pod_init {

struct InterfaceAddress {
  std::string interface;
  std::string address;  // canonical text (IPv4 or IPv6)
};

// Every address of every interface of this machine (getifaddrs). Returns 0 or -errno.
int interface_addresses(std::vector<InterfaceAddress>* addresses);

// The interface holding the source address the kernel picks for `address`
// (a UDP connect, nothing is sent). With `address` empty, the default
// route's. Returns 0, -ENETUNREACH without a route, or another -errno.
int route_interface(const std::string& address, std::string* interface, std::string* source);

bool interface_exists(const std::string& name);

// A bridge with no physical port (docker0, cni0, virbr0: only veths behind
// it): container plumbing, not a path between nodes. A host bridge over the
// real NIC is not one. `sys_class_net` is normally /sys/class/net.
bool is_container_bridge(const std::string& name, const std::string& sys_class_net);

}  // namespace pod_init
