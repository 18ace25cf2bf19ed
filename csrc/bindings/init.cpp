// Supervision, as pod-init's: the command's loop, parent death, reaping; and
// the files a long-lived interpreter loaded, checked before it serves a launch.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings/bindings.hpp"
#include "common/error.hpp"
#include "common/file_snapshot.hpp"
#include "init/boot_state.hpp"
#include "init/supervisor.hpp"

namespace pod_init::bindings {

void bind_init(py::module_& m) {
  m.def(
      "supervise",
      [](const std::vector<std::string>& command, const std::map<std::string, std::string>& env,
         double grace_s, const std::optional<py::function>& on_signal,
         const std::optional<py::function>& on_tick, double tick_s,
         const std::optional<py::function>& on_log, int parent_death_signal) {
        if (command.empty()) throw py::value_error("no command to run");
        if (!(grace_s >= 0 && grace_s <= 86400) || !(tick_s >= 0 && tick_s <= 3600)) {
          throw py::value_error("grace_s must be from 0 to 86400 and tick_s from 0 to 3600");
        }
        pod_init::SupervisorOptions options;
        options.command = command;
        for (const auto& [key, value] : env) options.environment.push_back(key + "=" + value);
        options.grace_ms = static_cast<unsigned>(grace_s * 1000);
        options.tick_ms = static_cast<unsigned>(tick_s * 1000);
        options.parent_death_signal = parent_death_signal;
        // Python callbacks run with the GIL; an exception in one is reported
        // as unraisable, never left to unwind through the loop that owns the child.
        // The result: false only where the callback returned False.
        auto call = [](const py::function& f, auto... args) {
          py::gil_scoped_acquire gil;
          try {
            const py::object result = f(args...);
            return !(py::isinstance<py::bool_>(result) && !result.cast<bool>());
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("pyinit._native.supervise callback");
            return true;
          }
        };
        if (on_signal) options.on_signal = [&](int sig) { return call(*on_signal, sig); };
        if (on_tick) options.on_tick = [&] { call(*on_tick); };
        if (on_log) options.log = [&](const std::string& line) { call(*on_log, line); };
        ReleasedGil release;
        return pod_init::supervise(options);
      },
      py::arg("command"), py::arg("env"), py::arg("grace_s") = 10.0,
      py::arg("on_signal") = py::none(), py::arg("on_tick") = py::none(), py::arg("tick_s") = 0.0,
      py::arg("on_log") = py::none(), py::arg("parent_death_signal") = 0,
      "Runs command as pod-init's supervisor does: TERM, INT, HUP, USR1, USR2, QUIT and WINCH "
      "forwarded (on_signal(signum) for each, first: it returns False for a signal that is "
      "the caller's own, which no line then calls forwarded), every child reaped, KILL "
      "grace_s after a forwarded TERM or INT; on_tick() at least every tick_s. Block those "
      "signals in every thread first (signal.pthread_sigmask before starting threads). "
      "Returns the exit code: "
      "the status, 128+N for signal N, 127 not found, 126 not executable. "
      "parent_death_signal: sent to the command if this process dies, even by KILL. Words as "
      "bytes (os.fsencode) where they need not be UTF-8.");

  m.def(
      "die_with_parent",
      [](int signal, int parent) {
        if (int rc = pod_init::die_with_parent(signal, parent); rc < 0) {
          throw pod_init::SysError(-rc, "prctl(PR_SET_PDEATHSIG)");
        }
      },
      py::arg("signal"), py::arg("parent"),
      "This process gets `signal` when its parent dies (at once if `parent` is gone already).");

  m.def(
      "io_priority",
      [](pid_t pid) {
        if (pid < 0) throw py::value_error("pid must be 0 (this process) or a process's id");
        int priority = pod_init::io_priority(pid);
        if (priority < 0) {
          throw pod_init::SysError(-priority, "ioprio_get",
                                   pid == 0 ? "" : "/proc/" + std::to_string(pid));
        }
        return priority;
      },
      py::arg("pid") = 0,
      "The IO priority of process `pid` (0: this one) as ioprio_get(2) gives it (class << 13 | "
      "level), as ionice(1) sets it.");

  m.def(
      "set_io_priority",
      [](int priority) {
        if (int rc = pod_init::set_io_priority(priority); rc < 0) {
          throw pod_init::SysError(-rc, "ioprio_set");
        }
      },
      py::arg("priority"), "Sets this process's IO priority (a value io_priority() gave).");

  m.def(
      "become_subreaper",
      [] {
        if (int rc = pod_init::become_subreaper(); rc < 0) {
          throw pod_init::SysError(-rc, "prctl(PR_SET_CHILD_SUBREAPER)");
        }
      },
      "Orphaned descendants re-parent to this process (PR_SET_CHILD_SUBREAPER).");

  m.def(
      "set_arguments_shown",
      [](const std::vector<std::string>& arguments) {
        int shown = pod_init::set_arguments_shown(arguments);
        if (shown < 0) throw pod_init::SysError(-shown, "rewrite", "/proc/self/cmdline");
        return shown;
      },
      py::arg("arguments"),
      "What ps and pkill -f read for this process: `arguments` (bytes, os.fsencode) after the "
      "program's name, over the command line it started with, cut where that line ends. "
      "Returns the bytes shown.");

  m.def("read_boot_id", &pod_init::read_boot_id, py::arg("proc_root") = "/proc",
        "This boot's id (/proc/sys/kernel/random/boot_id), as PID 1 records it; '' when the "
        "kernel does not say.");

  m.def(
      "end_children",
      [](double grace_s) {
        if (!(grace_s >= 0 && grace_s <= 3600)) {
          throw py::value_error("grace_s must be from 0 to 3600");
        }
        ReleasedGil release;
        return pod_init::end_children(static_cast<unsigned>(grace_s * 1000));
      },
      py::arg("grace_s") = 0.0,
      "Ends every process still a child of this one, orphans that re-parent here included: "
      "TERM, grace_s for them to end, then KILL; returns how many were signalled.");

  // Paths as bytes (os.fsencode): a module's file name need not be UTF-8.
  py::class_<pod_init::FileSnapshot>(
      m, "FileSnapshot",
      "Files (bytes paths) as they are on disk now: time, size, inode; one that "
      "cannot be stat'ed is left out.")
      .def(py::init<const std::vector<std::string>&>(), py::arg("paths"))
      .def("__len__", [](const pod_init::FileSnapshot& s) { return s.paths().size(); })
      .def(
          "first_change",
          [](const pod_init::FileSnapshot& s) -> std::optional<std::tuple<py::bytes, int>> {
            pod_init::FileSnapshot::Change change = s.first_change();
            if (change.index < 0) return std::nullopt;
            return std::make_tuple(py::bytes(s.paths()[change.index]), change.err);
          },
          "None, or (path, errno) of the first file changed since: errno 0 when it "
          "is there with another time, size or inode.");
}

}  // namespace pod_init::bindings
