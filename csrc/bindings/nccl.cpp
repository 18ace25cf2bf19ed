// NCCL: node lists, the configuration, the tuner's tables.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <cerrno>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.hpp"
#include "common/error.hpp"
#include "nccl/hostfile.hpp"
#include "nccl/nccl_config.hpp"
#include "nccl/netif.hpp"
#include "nccl/tuner/tuning_table.hpp"

namespace pod_init::bindings {

void bind_nccl(py::module_& m) {
  m.def(
      "expand_nodelist",
      [](const std::string& list) {
        std::vector<std::string> names;
        pod_init::LineError error;
        if (pod_init::expand_nodelist(list, &names, &error) < 0) {
          throw pod_init::InputError("", 0, error.message);
        }
        return names;
      },
      py::arg("nodelist"), "node[01-03],gpu-a -> [node01, node02, node03, gpu-a] (SLURM style).");

  m.def(
      "route_to",
      [](const std::string& address) {
        std::string interface, source;
        int rc = pod_init::route_interface(address, &interface, &source);
        if (rc == -EINVAL) throw pod_init::InputError("", 0, "not an IP address: " + address);
        if (rc < 0) throw pod_init::SysError(-rc, "find the route to", address);
        return py::make_tuple(interface, source);
      },
      py::arg("address"),
      "(interface, source address) this host reaches `address` (an IP address) through, the "
      "kernel's choice for a connection to it (nothing is sent); with \"\", the default "
      "route's. OSError without a route (ENETUNREACH) or when the source address is on no "
      "interface.");

  m.def(
      "tuning_table_rules",
      [](const std::string& text, const std::string& source) {
        const pod_init::TuningTable table = pod_init::parse_tuning_table(text, source);
        py::list rules;
        for (const pod_init::TunerRule& r : table.rules) {
          rules.append(py::make_tuple(r.collective, r.min_bytes, r.max_bytes, r.choice.algorithm,
                                      r.choice.protocol, r.choice.channels));
        }
        return py::make_tuple(table.nccl_version, table.ranks, table.nodes, rules);
      },
      py::arg("text"), py::arg("source"),
      "A tuning table as the NCCL tuner plugin reads it: (nccl_version, ranks, nodes, rules), "
      "each rule (collective, min_bytes, max_bytes, algorithm, protocol, channels) in NCCL's "
      "numbering, -1/0 where NCCL chooses. InputError naming source for a table the plugin "
      "would refuse.");

  py::class_<pod_init::NcclConfig>(m, "NcclConfig")
      // Paths and the texts that name them as Python names files: a folder's name
      // need not be UTF-8.
      .def_property_readonly("out_dir",
                             [](const pod_init::NcclConfig& c) { return fs_str(c.out_dir); })
      .def_property_readonly(
          "files",
          [](const pod_init::NcclConfig& c) {
            py::typing::Dict<py::str, py::str> files;
            for (const auto& [name, content] : c.files) files[fs_str(name)] = fs_str(content);
            return files;
          },
          "File name -> content, as write() puts them in out_dir.")
      .def_property_readonly(
          "ring", [](const pod_init::NcclConfig& c) { return c.ring.order; },
          "GPU indices in ring order.")
      .def_property_readonly(
          "env",
          [](const pod_init::NcclConfig& c) {
            py::typing::Dict<py::str, py::str> env;
            for (const auto& setting : c.env) env[fs_str(setting.key)] = fs_str(setting.value);
            return env;
          },
          "The env file's settings (the environment's values where it had them).")
      .def_readonly("node_rank", &pod_init::NcclConfig::node_rank)
      .def(
          "write",
          [](const pod_init::NcclConfig& c) {
            ReleasedGil release;
            pod_init::write_nccl_files(c);
          },
          "Writes every file under out_dir, each whole or not at all.")
      .def(
          "summary",
          [](const pod_init::NcclConfig& c) { return fs_str(pod_init::nccl_summary(c)); },
          "What `pod-init nccl` prints.");

  m.def(
      "nccl_config",
      [](const pod_init::Topology& topology, const std::optional<pod_init::NodeList>& nodes,
         const std::string& hints, const std::string& out_dir, const std::string& socket_ifname,
         bool force_rings, int channels, const DetailsArg& details,
         const std::map<std::string, std::string>& environment, const std::string& proc_root,
         const std::map<std::string, std::string>& tuned_env, const std::string& tuning_table) {
        ReleasedGil release;
        pod_init::NcclRequest request =
            pod_init::make_nccl_request(topology, {hints, proc_root, environment});
        if (nodes) request.nodes = *nodes;
        request.out_dir = out_dir;
        request.socket_ifname = socket_ifname;
        request.force_rings = force_rings;
        request.channels = channels;
        request.details = to_details(details);
        request.environment = environment;
        request.tuned_env = tuned_env;
        request.tuning_table = tuning_table;
        return pod_init::build_nccl_config(request);
      },
      py::arg("topology"), py::kw_only(), py::arg("nodes") = py::none(), py::arg("hints") = "",
      py::arg("out_dir") = ".", py::arg("socket_ifname") = "", py::arg("force_rings") = false,
      py::arg("channels") = 0, py::arg("details") = DetailsArg{},
      py::arg("environment") = std::map<std::string, std::string>{}, py::arg("proc_root") = "/proc",
      py::arg("tuned_env") = std::map<std::string, std::string>{}, py::arg("tuning_table") = "",
      "Builds the NCCL configuration from a scanned topology and a node list (nothing is "
      "written until write()); tuned_env and tuning_table: a measured tuning for this node, "
      "its settings added to the env file and the table written beside it. InputError for bad "
      "input, OSError when the hints file cannot be read.");

  py::class_<pod_init::NodeList>(m, "NodeList")
      .def_property_readonly(
          "addresses",
          [](const pod_init::NodeList& nodes) {
            std::vector<std::string> addresses;
            for (const pod_init::HostEntry& host : nodes.hosts) addresses.push_back(host.address);
            return addresses;
          },
          "Every node's address, node 0 (the master) first.")
      .def_readonly("node_rank", &pod_init::NodeList::node_rank, "This node's index.")
      .def_readonly("interface", &pod_init::NodeList::interface,
                    "The interface holding this node's address.")
      .def_property_readonly(
          "source", [](const pod_init::NodeList& nodes) { return fs_str(nodes.source); },
          "The hostfile.")
      .def_readonly("planned_elsewhere", &pod_init::NodeList::planned_elsewhere,
                    "node_rank was given (--node), not found among this machine's addresses.");

  m.def(
      "load_node_list",
      [](const std::string& hostfile, const std::string& hostfile_text, int node) {
        if (node < -1) throw py::value_error("node must be >= 0, or -1 for this machine");
        ReleasedGil release;
        return pod_init::load_node_list(hostfile, hostfile_text, node);
      },
      py::arg("hostfile"), py::arg("hostfile_text") = "", py::arg("node") = -1,
      "This node among the nodes of a hostfile of IP addresses (hostfile_text instead of reading "
      "the file when given; the path still names errors), or node `node` of them when it is "
      "not -1 (a plan for another machine). InputError for bad content, OSError when the file "
      "cannot be read.");
}

}  // namespace pod_init::bindings
