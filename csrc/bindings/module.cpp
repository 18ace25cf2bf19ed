// pyinit._native: the core as is, one bind_* per concern; pyinit/topology.py
// turns its JSON into dataclasses.
#include <pybind11/pybind11.h>

#include "bindings/bindings.hpp"
#include "common/error.hpp"
#include "common/text.hpp"
#include "io/direct_reader.hpp"
#include "nccl/hostfile.hpp"
#include "nccl/nccl_config.hpp"
#include "nvml/nvml_library.hpp"
#include "topology/topology.hpp"

namespace py = pybind11;

namespace pod_init::bindings {

py::str fs_str(const std::string& text) {
  PyObject* decoded =
      PyUnicode_DecodeFSDefaultAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

}  // namespace pod_init::bindings

PYBIND11_MODULE(_native, m) {
  m.doc() = "pod-init native core: PCIe topology scan and NCCL configuration";
  m.attr("__version__") = POD_INIT_VERSION;
  // The core's limits, which the command lines' ranges are made from.
  m.attr("MAX_CHANNELS") = pod_init::kMaxChannels;
  m.attr("MAX_EXPECTED_GPUS") = pod_init::kMaxExpectedGpus;
  m.attr("MAX_HOSTS") = pod_init::kMaxHosts;
  m.attr("MAX_QUEUE_DEPTH") = pod_init::kMaxQueueDepth;

  // OSError(errno, "operation: text", path) picks the subclass
  // (FileNotFoundError, PermissionError, ...) and sets .errno and .filename;
  // bad input becomes pyinit.errors.InputError (a ValueError) with its file and line.
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const pod_init::SysError& e) {
      py::object text = py::str(e.operation() + ": " + pod_init::errno_text(e.err()));
      // A path that is not UTF-8 comes back as Python names it (surrogate escapes).
      py::object path =
          e.path().empty() ? py::none() : py::object(pod_init::bindings::fs_str(e.path()));
      py::object error = py::reinterpret_borrow<py::object>(PyExc_OSError)(e.err(), text, path);
      PyErr_SetObject(PyExc_OSError, error.ptr());
    } catch (const pod_init::InputError& e) {
      py::object type = py::module_::import("pyinit.errors").attr("InputError");
      // The message quotes what a user wrote: control bytes and bytes that are
      // not UTF-8 come as \xNN, as pod-init prints them.
      py::object error =
          type(pod_init::printable(e.message()), py::arg("file") = pod_init::printable(e.file()),
               py::arg("line") = e.line());
      PyErr_SetObject(type.ptr(), error.ptr());
    } catch (const pod_init::nvml::Error& e) {
      // NVML's refusal is the caller's reason to carry on without NVML.
      py::object type = py::module_::import("pyinit.nvml").attr("NvmlUnavailable");
      PyErr_SetObject(type.ptr(), type(e.what()).ptr());
    }
  });

  pod_init::bindings::bind_topology(m);
  pod_init::bindings::bind_nccl(m);
  pod_init::bindings::bind_init(m);
  pod_init::bindings::bind_io(m);
  pod_init::bindings::bind_nvml(m);
}
