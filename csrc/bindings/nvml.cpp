// NVML's answers about the GPUs (nvml::NvmlGpus) as plain Python values;
// pyinit/nvml.py builds its view from them. Each call leaves the GIL to the
// other threads while it is in the driver.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings/bindings.hpp"
#include "nvml/nvml_gpus.hpp"

namespace pod_init::bindings {

using nvml::NvmlGpus;

namespace {

// `query` as a function pybind11 can bind (the same arguments, the instance
// first) that runs with the GIL released; its value is converted after.
template <typename R, typename... A>
auto released(R (NvmlGpus::*query)(A...) const) {
  return [query](const NvmlGpus& gpus, A... args) {
    ReleasedGil release;
    return (gpus.*query)(args...);
  };
}

template <typename R, typename... A>
auto released(R (NvmlGpus::*query)(A...)) {
  return [query](NvmlGpus& gpus, A... args) {
    ReleasedGil release;
    return (gpus.*query)(args...);
  };
}

}  // namespace

void bind_nvml(py::module_& m) {
  py::class_<NvmlGpus>(m, "NvmlGpus",
                       "NVML's answers about this node's GPUs, each by NVML's index. A query "
                       "NVML refuses raises pyinit.nvml.NvmlUnavailable naming the call and GPU.")
      .def(py::init<>())
      .def(
          "open",
          [](NvmlGpus& gpus, const std::string& library) {
            if (gpus.is_open()) throw py::value_error("NVML is already open here");
            ReleasedGil release;
            return gpus.open(library);
          },
          py::arg("library") = "libnvidia-ml.so.1",
          "Loads NVML (a name the loader searches for, or a file) and initialises it: '' or "
          "why not, in one line.")
      .def_property_readonly("count", &NvmlGpus::count)
      .def("driver_version", released(&NvmlGpus::driver_version))
      .def("bus_id", released(&NvmlGpus::bus_id), py::arg("gpu"))
      .def("name", released(&NvmlGpus::name), py::arg("gpu"))
      .def("cuda_capability", released(&NvmlGpus::cuda_capability), py::arg("gpu"))
      .def("memory_total", released(&NvmlGpus::memory_total), py::arg("gpu"))
      .def("bar1_total", released(&NvmlGpus::bar1_total), py::arg("gpu"))
      .def(
          "pcie_link",
          [](NvmlGpus& g, unsigned i) {
            nvml::PcieLink link = released(&NvmlGpus::pcie_link)(g, i);
            return std::make_tuple(link.generation, link.max_generation, link.width,
                                   link.max_width);
          },
          py::arg("gpu"), "(current generation, max generation, current width, max width)")
      .def(
          "nvlinks",
          [](NvmlGpus& g, unsigned i) {
            std::vector<nvml::NvLinkEnd> links = released(&NvmlGpus::nvlinks)(g, i);
            std::vector<std::tuple<unsigned, std::string, std::optional<unsigned>>> out;
            for (const nvml::NvLinkEnd& end : links) {
              out.emplace_back(end.link, end.remote_bus_id, end.remote_type);
            }
            return out;
          },
          py::arg("gpu"), "Active links: (link, remote bus id, nvmlIntNvLinkDeviceType_t or None).")
      .def("p2p_status", released(&NvmlGpus::p2p_status), py::arg("a"), py::arg("b"),
           py::arg("capability"))
      .def("common_ancestor", released(&NvmlGpus::common_ancestor), py::arg("a"), py::arg("b"))
      .def(
          "health",
          [](NvmlGpus& g, unsigned i) {
            nvml::GpuHealth h = released(&NvmlGpus::health)(g, i);
            py::dict out;
            out["ecc_enabled"] = h.ecc_enabled;
            out["ecc_uncorrected_volatile"] = h.ecc_uncorrected_volatile;
            out["remapped_uncorrectable"] = h.remapped_uncorrectable;
            out["remap_pending"] = h.remap_pending;
            out["remap_failed"] = h.remap_failed;
            return out;
          },
          py::arg("gpu"),
          "ECC mode, uncorrected errors since the driver loaded, row remapping; None where "
          "the GPU has no answer.")
      .def(
          "counters",
          [](NvmlGpus& g, unsigned i) {
            nvml::GpuCounters c = released(&NvmlGpus::counters)(g, i);
            py::dict out;
            out["uuid"] = c.uuid;
            out["utilization_percent"] = double(c.utilization_percent);
            out["memory_used_bytes"] = c.memory_used_bytes;
            out["pcie_tx_bytes_per_s"] = c.pcie_tx_bytes_per_s;
            out["pcie_rx_bytes_per_s"] = c.pcie_rx_bytes_per_s;
            out["temperature_celsius"] = double(c.temperature_celsius);
            out["nvlink_tx_bytes_total"] = c.nvlink_tx_bytes_total;
            out["nvlink_rx_bytes_total"] = c.nvlink_rx_bytes_total;
            return out;
          },
          py::arg("gpu"), "What the monitor samples, now.")
      .def("watch_xids", released(&NvmlGpus::watch_xids), py::arg("gpus"),
           "Xid events from these GPUs from now on; False where none can be delivered.")
      .def("xid_events", released(&NvmlGpus::xid_events),
           "(GPU, Xid) for each event since the last call; never blocks.");
}

}  // namespace pod_init::bindings
