// The topology: a scan, or one loaded from `pod-init topo --json`.
#include "topology/topology.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings/bindings.hpp"
#include "topology/nvlink.hpp"
#include "topology/report.hpp"

namespace pod_init::bindings {

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

void bind_topology(py::module_& m) {
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
          "True when a finding has severity error.")
      .def(
          "expect_gpus",
          [](pod_init::Topology& t, int count) {
            if (count < 0) throw py::value_error("expect_gpus must be >= 0");
            pod_init::expect_gpus(&t, count);
          },
          py::arg("count"), "Replaces the GPU-count finding with one for this expectation.")
      .def_property_readonly(
          "sysfs_root", [](const pod_init::Topology& t) { return t.sysfs_root; },
          "The tree it was scanned from.");

  m.def(
      "load_topology",
      [](const std::string& text, const std::string& source) {
        return pod_init::topology_from_json(text, source);
      },
      py::arg("text"), py::arg("source"),
      "The Topology a `pod-init topo --json` document describes (a scan reused, not repeated). "
      "InputError naming source when it is not one.");

  m.def(
      "scan_topology",
      [](const std::string& sysfs_root, int expect_gpus, bool probe_bar0) {
        if (sysfs_root.empty()) throw py::value_error("sysfs_root must not be empty");
        if (expect_gpus < -1) throw py::value_error("expect_gpus must be >= 0, or -1 for none");
        ReleasedGil release;
        return pod_init::scan({sysfs_root, expect_gpus, probe_bar0});
      },
      py::arg("sysfs_root") = "/sys", py::arg("expect_gpus") = -1, py::arg("probe_bar0") = true,
      "Scans the PCI tree under sysfs_root. Raises OSError when it has no bus/pci/devices.");
}

}  // namespace pod_init::bindings
