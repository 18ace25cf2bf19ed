#include "nccl/netif.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/sysfs.hpp"

namespace pod_init {

namespace {

// Fills a sockaddr for `address` (IPv4 or IPv6 text) on the discard port.
socklen_t make_sockaddr(const std::string& address, sockaddr_storage* storage) {
  std::memset(storage, 0, sizeof *storage);
  auto* v4 = reinterpret_cast<sockaddr_in*>(storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(9);
    return sizeof *v4;
  }
  if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(9);
    return sizeof *v6;
  }
  return 0;
}

std::string address_text(const sockaddr* addr) {
  char out[INET6_ADDRSTRLEN] = "";
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, out, sizeof out);
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, out, sizeof out);
  }
  return out;
}

}  // namespace

int route_interface(const std::string& address, std::string* interface, std::string* source) {
  // Without a master, an address from TEST-NET-1 (RFC 5737, normally off-link)
  // shows which interface the default route uses.
  std::string target = address.empty() ? "192.0.2.1" : address;
  sockaddr_storage remote{};
  socklen_t length = make_sockaddr(target, &remote);
  if (length == 0) return -EINVAL;
  int fd = socket(remote.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_storage local{};
  socklen_t local_length = sizeof local;
  int rc = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&remote), length) < 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) < 0) {
    rc = -errno;
  }
  close(fd);
  if (rc < 0) return rc;
  *source = address_text(reinterpret_cast<sockaddr*>(&local));

  // The interface that holds the source address; a route to this host's own
  // address goes through lo, but the address belongs to the real interface.
  std::vector<InterfaceAddress> addresses;
  if ((rc = interface_addresses(&addresses)) < 0) return rc;
  for (const InterfaceAddress& entry : addresses) {
    if (entry.address == *source) {
      *interface = entry.interface;
      return 0;
    }
  }
  return -ENODEV;
}

int interface_addresses(std::vector<InterfaceAddress>* addresses) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) < 0) return -errno;
  addresses->clear();
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    std::string text = address_text(it->ifa_addr);
    if (!text.empty()) addresses->push_back({it->ifa_name, text});
  }
  freeifaddrs(list);
  return 0;
}

bool interface_exists(const std::string& name) {
  return !name.empty() && if_nametoindex(name.c_str()) != 0;
}

bool is_container_bridge(const std::string& name, const std::string& sys_class_net) {
  std::string bridge = sys_class_net + "/" + name;
  struct stat st {};
  if (stat((bridge + "/bridge").c_str(), &st) < 0) return false;
  // A host bridge that carries the uplink enslaves a physical port (one with a
  // `device` link); docker0, cni0 and the like only hold veths, or nothing.
  std::vector<std::string> ports;
  if (sysfs::list_dir(bridge + "/brif", &ports) < 0) return true;
  return std::none_of(ports.begin(), ports.end(), [&](const std::string& port) {
    return stat((sys_class_net + "/" + port + "/device").c_str(), &st) == 0;
  });
}

}  // namespace pod_init
