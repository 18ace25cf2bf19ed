// Multi-node host lists without DNS: hostfiles of IP addresses, SLURM's
// compressed node lists, this node's rank among them, /etc/hosts lines.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/line_input.hpp"

namespace pod_init {

// The most hosts a hostfile or a node list may name: far beyond any cluster one
// NCCL job spans, and a bound on what a compressed list like 10.[0-255].[0-255].[0-255]
// may expand to.
inline constexpr size_t kMaxHosts = 65536;
// The longest host name (DNS allows 253 characters; an IPv6 literal needs 45).
inline constexpr size_t kMaxNameLength = 255;

struct HostEntry {
  std::string address;  // canonical text form of the IP address, or a name when names are allowed
  int slots = 0;        // 0: not given
  int line = 0;         // 1-based line in the hostfile
};

// One host per line: `ADDRESS [slots=N]`, where ADDRESS may be a compressed
// list (`10.0.0.[1-4]`); `#` starts a comment; blank lines are skipped. Names that are not IP
// addresses are an error unless `allow_names`. Duplicates are an error. Returns 0 or -EINVAL with
// `error`.
int parse_hostfile(std::string_view text, bool allow_names, std::vector<HostEntry>* hosts,
                   LineError* error);

// "node[01-03,07],gpu-a" -> node01 node02 node03 node07 gpu-a. Several bracket
// groups in one name expand as a product. Returns 0 or -EINVAL with `error`.
int expand_nodelist(std::string_view list, std::vector<std::string>* names, LineError* error);

// The index of the one host whose address is among `own_addresses`; -ENOENT
// when none is, -EEXIST when several are, each with `error` naming the lines.
int find_own_rank(const std::vector<HostEntry>& hosts,
                  const std::vector<std::string>& own_addresses, int* rank, LineError* error);

// "ADDRESS node-K" lines, node 0 first: the master is node-0.
std::string hosts_lines(const std::vector<HostEntry>& hosts);

struct NodeList {
  std::vector<HostEntry> hosts;    // node 0 (the master) first
  int node_rank = 0;               // this node's index
  std::string interface;           // the interface holding this node's address
  std::string source;              // the hostfile, naming errors about its lines
  bool planned_elsewhere = false;  // node_rank was given: files for another machine
};

// The API layer over the above: parses the hostfile (`text`, or read from
// `path` when empty; names are an error; neither: this node alone, and a
// `node` then is an InputError, --node needing --hostfile) and finds this node by the addresses
// of its interfaces, or takes `node` (0 to hosts - 1) when it is not -1: a plan
// for that node of a cluster this machine need not belong to. Throws
// InputError naming the file and line (or the node out of range), SysError
// when the interfaces cannot be listed.
NodeList load_node_list(const std::string& path, const std::string& text, int node = -1);

// Canonical text of an IPv4/IPv6 address; "" when `text` is not one.
std::string canonical_address(std::string_view text);

}  // namespace pod_init
