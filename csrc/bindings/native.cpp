// pyinit._native: the only file that includes pybind11. It exposes the core
// as is; pyinit/topology.py turns its JSON into dataclasses.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "pod_init/error.hpp"
#include "pod_init/report.hpp"
#include "pod_init/topology.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() = "pod-init native core: PCIe topology scan";
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

  py::class_<pod_init::Topology>(m, "Topology")
      .def("to_json", &pod_init::topology_json, "The document `pod-init topo --json` prints.")
      .def("to_text", &pod_init::topology_text, "The matrix `pod-init topo` prints.")
      .def_property_readonly(
          "has_errors",
          [](const pod_init::Topology& t) { return pod_init::has_errors(t.findings); },
          "True when a finding has severity error.");

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
}
