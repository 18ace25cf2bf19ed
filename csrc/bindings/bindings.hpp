// The binding's shared parts: one bind_* per concern, each converting types
// and nothing more (the core checks and decides), and the one conversion two
// concerns share. Only csrc/bindings/ includes pybind11.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "topology/nvlink.hpp"

namespace pod_init::bindings {

namespace py = pybind11;

// {bdf: (sm, link_gbs, [(target, "gpu" | "switch", count), ...])}: plain
// Python data, so pyinit's NVML layer needs no native types.
using DetailsArg =
    std::map<std::string,
             std::tuple<int, double, std::vector<std::tuple<std::string, std::string, int>>>>;

pod_init::GpuDetailsMap to_details(const DetailsArg& arg);

// Text that holds a path, as Python names a file (os.fsdecode): bytes that are
// not UTF-8 come back as surrogate escapes, where pybind11's own conversion of
// a std::string would raise UnicodeDecodeError.
py::str fs_str(const std::string& text);

// The GIL released for a blocking call, as py::gil_scoped_release, except at
// interpreter exit. Python (before 3.14) ends a daemon thread that takes the
// GIL back during finalisation with pthread_exit(); its forced unwind through
// gil_scoped_release's noexcept destructor ends the whole process with
// std::terminate ("terminate called without an active exception", SIGABRT),
// whatever the script did right. Such a thread waits for the process's end
// instead, as Python 3.14 makes it. The thread doing the finalising takes the
// GIL back as always: it closes what the script left open (a generator's
// stream), and parked it would hang the exit. Should finalisation begin
// between the check and the re-acquisition, the destructor may let the unwind
// through.
class ReleasedGil {
 public:
  ReleasedGil() : state_(PyEval_SaveThread()) {}
  ~ReleasedGil() noexcept(false);
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

void bind_topology(py::module_& m);
void bind_nccl(py::module_& m);
void bind_init(py::module_& m);
void bind_io(py::module_& m);
void bind_nvml(py::module_& m);

}  // namespace pod_init::bindings
