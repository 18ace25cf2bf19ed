#include "nccl/hostfile.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <unordered_map>

#include "common/error.hpp"
#include "common/line_input.hpp"
#include "common/sysfs.hpp"
#include "nccl/netif.hpp"

namespace pod_init {

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  return text;
}

bool valid_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == ':';  // ':' for IPv6 literals
  });
}

// Splits at commas outside brackets.
std::vector<std::string_view> split_top_level(std::string_view list) {
  std::vector<std::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    } else if (list[i] == '[') {
      ++depth;
    } else if (list[i] == ']') {
      --depth;
    }
  }
  return items;
}

// What a message quotes of a name: enough to find it, never a 60 KB line.
std::string quoted(std::string_view item) {
  return "'" + std::string(item.substr(0, 64)) + (item.size() > 64 ? "...'" : "'");
}

// One bracket group's numbers: low..high, each padded to `width` digits.
struct Range {
  int64_t low = 0;
  int64_t high = 0;
  size_t width = 0;
};

// "a[1-3,7]b[8-9]": the text before each group, the group's ranges, and the text after the last.
struct NamePattern {
  std::vector<std::string_view> literals;  // one more than groups
  std::vector<std::vector<Range>> groups;
};

int parse_pattern(std::string_view item, NamePattern* pattern, LineError* error) {
  size_t at = 0;
  uint64_t count = 1;  // names the pattern expands to
  size_t longest = 0;  // the longest of them, in characters
  for (;;) {
    size_t open = item.find('[', at);
    if (open == std::string_view::npos) break;
    size_t close = item.find(']', open);
    if (close == std::string_view::npos)
      return fail_line(error, 0, "unclosed '[' in " + quoted(item));
    pattern->literals.push_back(item.substr(at, open - at));
    longest += open - at;
    std::string_view ranges = item.substr(open + 1, close - open - 1);
    if (ranges.empty()) return fail_line(error, 0, "empty range in " + quoted(item));
    std::vector<Range> group;
    uint64_t in_group = 0;
    size_t widest = 0;
    for (std::string_view range : split_top_level(ranges)) {
      size_t dash = range.find('-');
      std::string_view low_text = range.substr(0, dash);
      std::string_view high_text =
          dash == std::string_view::npos ? low_text : range.substr(dash + 1);
      auto low = sysfs::parse_int(low_text);
      auto high = sysfs::parse_int(high_text);
      if (!low || !high || *low < 0 || *high < *low || *high - *low > 100000) {
        return fail_line(error, 0, "bad range " + quoted(range) + " in " + quoted(item));
      }
      // Zero padding follows the written lower bound: node[01-10] -> node01 ... node10.
      Range r{*low, *high, low_text.size()};
      group.push_back(r);
      in_group += static_cast<uint64_t>(*high - *low + 1);
      widest = std::max({widest, r.width, std::to_string(*high).size()});
    }
    // Bounded before anything is expanded: the product of the groups, and each name's length.
    count *= in_group;
    longest += widest;
    if (count > kMaxHosts) {
      return fail_line(
          error, 0, quoted(item) + " expands to more than " + std::to_string(kMaxHosts) + " names");
    }
    if (longest > kMaxNameLength) {
      return fail_line(error, 0,
                       quoted(item) + " expands to names longer than " +
                           std::to_string(kMaxNameLength) + " characters");
    }
    pattern->groups.push_back(std::move(group));
    at = close + 1;
  }
  pattern->literals.push_back(item.substr(at));
  if (longest + item.size() - at > kMaxNameLength) {
    return fail_line(error, 0,
                     "node name " + quoted(item) + " is longer than " +
                         std::to_string(kMaxNameLength) + " characters");
  }
  return 0;
}

std::string digits_of(int64_t n, size_t width) {
  std::string digits = std::to_string(n);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Expands "a[1-3,7]b[..]" as the product of its bracket groups, the last
// group turning fastest (as SLURM lists them); no recursion, so the nesting
// of a hostile list costs nothing but its length.
int expand_item(std::string_view item, std::vector<std::string>* names, LineError* error) {
  NamePattern pattern;
  if (int rc = parse_pattern(item, &pattern, error); rc < 0) return rc;
  const size_t groups = pattern.groups.size();
  // Per group: which range, and which number in it.
  std::vector<size_t> range(groups, 0);
  std::vector<int64_t> number(groups);
  for (size_t g = 0; g < groups; ++g) number[g] = pattern.groups[g][0].low;
  for (;;) {
    std::string name(pattern.literals[0]);
    for (size_t g = 0; g < groups; ++g) {
      name += digits_of(number[g], pattern.groups[g][range[g]].width);
      name += pattern.literals[g + 1];
    }
    if (name.find(']') != std::string::npos || !valid_name(name)) {
      return fail_line(error, 0, "bad node name " + quoted(name));
    }
    if (names->size() >= kMaxHosts) {
      return fail_line(error, 0, "expands to more than " + std::to_string(kMaxHosts) + " names");
    }
    names->push_back(std::move(name));
    // The next combination: advance the last group, carrying leftwards.
    size_t g = groups;
    while (g > 0) {
      --g;
      const std::vector<Range>& ranges = pattern.groups[g];
      if (number[g] < ranges[range[g]].high) {
        ++number[g];
        break;
      }
      if (range[g] + 1 < ranges.size()) {
        number[g] = ranges[++range[g]].low;
        break;
      }
      range[g] = 0;
      number[g] = ranges[0].low;
      if (g == 0) return 0;
    }
    if (groups == 0) return 0;
  }
}

}  // namespace

std::string canonical_address(std::string_view text) {
  std::string copy(text);
  char out[INET6_ADDRSTRLEN];
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, copy.c_str(), &v4) == 1) {
    return inet_ntop(AF_INET, &v4, out, sizeof out) ? out : "";
  }
  if (inet_pton(AF_INET6, copy.c_str(), &v6) == 1) {
    return inet_ntop(AF_INET6, &v6, out, sizeof out) ? out : "";
  }
  return "";
}

int parse_hostfile(std::string_view text, bool allow_names, std::vector<HostEntry>* hosts,
                   LineError* error) {
  hosts->clear();
  std::unordered_map<std::string, int> first_line;  // address -> its line: duplicates in O(1)
  int rc = for_each_fields_line(text, [&](int line_no, const std::vector<std::string>& fields) {
    int slots = 0;
    for (size_t i = 1; i < fields.size(); ++i) {
      const std::string& extra = fields[i];
      if (extra.rfind("slots=", 0) != 0) {
        return fail_line(error, line_no, "unexpected " + quoted(extra) + " (expected slots=N)");
      }
      auto value = sysfs::parse_int(extra.substr(6));
      if (!value || *value < 1 || *value > 4096) {
        return fail_line(error, line_no,
                         "slots must be a whole number from 1 to 4096: " + quoted(extra));
      }
      slots = static_cast<int>(*value);
    }
    // A line may hold a compressed list (`10.0.0.[1-4]`, `gpu[01-08]`): one host each.
    std::vector<std::string> names;
    if (expand_nodelist(fields[0], &names, error) < 0) {
      return fail_line(error, line_no, error->message);
    }
    for (const std::string& host : names) {
      HostEntry entry{canonical_address(host), slots, line_no};
      if (entry.address.empty()) {
        if (!allow_names) {
          return fail_line(error, line_no,
                           quoted(host) + " is not an IP address (DNS is not used)");
        }
        entry.address = host;
      }
      auto [seen, added] = first_line.emplace(entry.address, line_no);
      if (!added) {
        return fail_line(error, line_no,
                         "duplicate host " + entry.address + " (first on line " +
                             std::to_string(seen->second) + ")");
      }
      if (hosts->size() >= kMaxHosts) {
        return fail_line(error, line_no,
                         "more than " + std::to_string(kMaxHosts) + " hosts in the file");
      }
      hosts->push_back(entry);
    }
    return 0;
  });
  if (rc < 0) return rc;
  if (hosts->empty()) return fail_line(error, 0, "no hosts");
  return 0;
}

int expand_nodelist(std::string_view list, std::vector<std::string>* names, LineError* error) {
  names->clear();
  list = trim(list);
  if (list.empty()) return fail_line(error, 0, "empty node list");
  for (std::string_view item : split_top_level(list)) {
    int rc = expand_item(trim(item), names, error);
    if (rc < 0) return rc;
  }
  return 0;
}

int find_own_rank(const std::vector<HostEntry>& hosts,
                  const std::vector<std::string>& own_addresses, int* rank, LineError* error) {
  std::vector<size_t> mine;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (std::find(own_addresses.begin(), own_addresses.end(), hosts[i].address) !=
        own_addresses.end()) {
      mine.push_back(i);
    }
  }
  if (mine.empty()) {
    *error = {0, "none of this node's addresses is in the host list"};
    return -ENOENT;
  }
  if (mine.size() > 1) {
    std::string lines;
    for (size_t i : mine) lines += (lines.empty() ? "" : ", ") + std::to_string(hosts[i].line);
    *error = {hosts[mine[1]].line, "this node appears on several lines: " + lines};
    return -EEXIST;
  }
  *rank = static_cast<int>(mine.front());
  return 0;
}

std::string hosts_lines(const std::vector<HostEntry>& hosts) {
  std::string out;
  for (size_t i = 0; i < hosts.size(); ++i) {
    out += hosts[i].address + " node-" + std::to_string(i) + "\n";
  }
  return out;
}

NodeList load_node_list(const std::string& path, const std::string& text, int node) {
  NodeList nodes;
  nodes.source = path;
  if (path.empty() && text.empty()) {
    if (node >= 0) throw InputError("", 0, "--node needs --hostfile: the cluster it is a node of");
    return nodes;  // this node alone
  }
  std::string content = text.empty() ? load_input_file(path) : text;
  LineError error;
  if (parse_hostfile(content, false, &nodes.hosts, &error) < 0) {
    throw InputError(path, error.line, error.message);
  }
  if (node >= 0) {
    if (static_cast<size_t>(node) >= nodes.hosts.size()) {
      throw InputError(path, 0,
                       "--node " + std::to_string(node) + ": the hostfile has " +
                           std::to_string(nodes.hosts.size()) + " nodes (0 to " +
                           std::to_string(nodes.hosts.size() - 1) + ")");
    }
    nodes.node_rank = node;
    nodes.planned_elsewhere = true;
    return nodes;
  }
  std::vector<InterfaceAddress> interfaces;
  int rc = interface_addresses(&interfaces);
  if (rc < 0) throw SysError(-rc, "getifaddrs");
  std::vector<std::string> own;
  for (const InterfaceAddress& entry : interfaces) own.push_back(entry.address);
  if (find_own_rank(nodes.hosts, own, &nodes.node_rank, &error) < 0) {
    throw InputError(path, error.line, error.message);
  }
  for (const InterfaceAddress& entry : interfaces) {
    if (entry.address == nodes.hosts[nodes.node_rank].address) nodes.interface = entry.interface;
  }
  return nodes;
}

}  // namespace pod_init
