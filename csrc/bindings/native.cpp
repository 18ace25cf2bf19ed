// pyinit._native: the only file that includes pybind11. It exposes the core
// as is; pyinit/topology.py turns its JSON into dataclasses.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "pod_init/error.hpp"
#include "pod_init/hostfile.hpp"
#include "pod_init/nccl_config.hpp"
#include "pod_init/nvlink.hpp"
#include "pod_init/report.hpp"
#include "pod_init/topology.hpp"

namespace py = pybind11;

namespace {

// {bdf: (sm, link_gbs, [(target, "gpu" | "switch", count), ...])}: plain
// Python data, so pyinit's NVML layer needs no native types.
using DetailsArg =
    std::map<std::string,
             std::tuple<int, double, std::vector<std::tuple<std::string, std::string, int>>>>;

pod_init::GpuDetailsMap to_details(const DetailsArg& arg) {
  pod_init::GpuDetailsMap details;
  for (const auto& [bdf, value] : arg) {
    const auto& [sm, link_gbs, links] = value;
    pod_init::GpuDetails& gpu = details[bdf];
    gpu.sm = sm;
    gpu.link_gbs = link_gbs;
    for (const auto& [target, peer, count] : links) {
      if (peer != "gpu" && peer != "switch") {
        throw py::value_error("NVLink peer must be 'gpu' or 'switch', not '" + peer + "'");
      }
      gpu.nvlinks.push_back(
          {target, peer == "gpu" ? pod_init::NvLinkPeer::Gpu : pod_init::NvLinkPeer::Switch,
           count});
    }
  }
  return details;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "pod-init native core: PCIe topology scan and NCCL configuration";
  m.attr("__version__") = POD_INIT_VERSION;

  // OSError(errno, text, path) picks the subclass (FileNotFoundError,
  // PermissionError, ...) and sets .errno and .filename.
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const pod_init::SysError& e) {
      py::object error = py::reinterpret_borrow<py::object>(PyExc_OSError)(
          e.err(), pod_init::errno_text(e.err()), e.path());
      PyErr_SetObject(PyExc_OSError, error.ptr());
    }
  });

  // Bad user input (hints, hostfile, options): a ValueError subclass whose text
  // names the file and line; the CLI exits 2 on it.
  py::register_exception<pod_init::InputError>(m, "InputError", PyExc_ValueError);

  py::class_<pod_init::Topology>(m, "Topology")
      .def(
          "merge_nvlinks",
          [](pod_init::Topology& t, const DetailsArg& details) {
            pod_init::merge_nvlinks(&t, to_details(details));
          },
          py::arg("details"), "Adds NVLink counts (NV#) to the matrix from NVML's view.")
      .def("to_json", &pod_init::topology_json, "The document `pod-init topo --json` prints.")
      .def("to_text", &pod_init::topology_text, "The matrix `pod-init topo` prints.")
      .def_property_readonly(
          "has_errors",
          [](const pod_init::Topology& t) { return pod_init::has_errors(t.findings); },
          "True when a finding has severity error.");

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
      "scan_topology",
      [](const std::string& sysfs_root, int expect_gpus, bool probe_bar0) {
        if (sysfs_root.empty()) throw py::value_error("sysfs_root must not be empty");
        if (expect_gpus < -1) throw py::value_error("expect_gpus must be >= 0, or -1 for none");
        py::gil_scoped_release release;
        return pod_init::scan({sysfs_root, expect_gpus, probe_bar0});
      },
      py::arg("sysfs_root") = "/sys", py::arg("expect_gpus") = -1, py::arg("probe_bar0") = true,
      "Scans the PCI tree under sysfs_root. Raises OSError when it has no bus/pci/devices.");

  py::class_<pod_init::NcclConfig>(m, "NcclConfig")
      .def_readonly("out_dir", &pod_init::NcclConfig::out_dir)
      .def_property_readonly(
          "files",
          [](const pod_init::NcclConfig& c) {
            std::map<std::string, std::string> files(c.files.begin(), c.files.end());
            return files;
          },
          "File name -> content, as write() puts them in out_dir.")
      .def_property_readonly(
          "ring", [](const pod_init::NcclConfig& c) { return c.ring.order; },
          "GPU indices in ring order.")
      .def_property_readonly(
          "env",
          [](const pod_init::NcclConfig& c) {
            std::map<std::string, std::string> env;
            for (const auto& setting : c.env) env[setting.key] = setting.value;
            return env;
          },
          "The env file's settings (the environment's values where it had them).")
      .def_readonly("node_rank", &pod_init::NcclConfig::node_rank)
      .def(
          "write",
          [](const pod_init::NcclConfig& c) {
            py::gil_scoped_release release;
            pod_init::write_nccl_files(c);
          },
          "Writes every file under out_dir, each whole or not at all.")
      .def("summary", &pod_init::nccl_summary, "What `pod-init nccl` prints.");

  m.def(
      "nccl_config",
      [](const std::string& sysfs_root, const std::string& proc_root, const std::string& hints,
         const std::string& hostfile, const std::string& hostfile_text, const std::string& out_dir,
         const std::string& socket_ifname, bool force_rings, int channels,
         const DetailsArg& details, const std::map<std::string, std::string>& environment) {
        pod_init::NcclRequest request;
        request.sysfs_root = sysfs_root;
        request.proc_root = proc_root;
        request.hints_path = hints;
        request.hostfile_path = hostfile;
        request.hostfile_text = hostfile_text;
        request.out_dir = out_dir;
        request.socket_ifname = socket_ifname;
        request.force_rings = force_rings;
        request.channels = channels;
        request.details = to_details(details);
        request.environment = environment;
        py::gil_scoped_release release;
        return pod_init::build_nccl_config(request);
      },
      py::arg("sysfs_root") = "/sys", py::arg("proc_root") = "/proc", py::arg("hints") = "",
      py::arg("hostfile") = "", py::arg("hostfile_text") = "", py::arg("out_dir") = ".",
      py::arg("socket_ifname") = "", py::arg("force_rings") = false, py::arg("channels") = 0,
      py::arg("details") = DetailsArg{},
      py::arg("environment") = std::map<std::string, std::string>{},
      "Builds the NCCL configuration (nothing is written until write()). Raises InputError for "
      "bad input, OSError when sysfs cannot be read.");
}
