// pod-init as the machine's init (PID 1 of the initial PID namespace, started
// by the kernel from the boot image): pseudo filesystems, console,
// configuration, modules, device nodes, topology preflight, NCCL files, the
// data mount and an optional switch to a real root, then the command, then a
// clean shutdown. It never returns: returning from PID 1 panics the kernel.
#pragma once

#include <string>

#include "init/init_config.hpp"

namespace pod_init {

// PID 1 of the initial PID namespace (its /proc/self/ns/pid is the kernel's
// fixed PROC_PID_INIT_INO), mounting /proc first when it is missing. PID 1 of
// a container's namespace is not: there pod-init acts as a plain supervisor.
bool is_machine_init();

[[noreturn]] void run_machine_init();

// "[    1.234567] pod-init: message" on stdout, the time since boot (CLOCK_BOOTTIME).
void boot_log(const std::string& message);

[[noreturn]] void end_machine(EndAction action);

}  // namespace pod_init
