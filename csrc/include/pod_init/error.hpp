// Error conventions: functions below the API layer return 0 or -errno and never
// touch the global errno; the API layer (scan(), the binding, the CLI) turns a
// negative result into a SysError exactly once, carrying the errno and the path.
#pragma once

#include <stdexcept>
#include <string>

namespace pod_init {

class SysError : public std::runtime_error {
 public:
  SysError(int err, std::string path);
  int err() const { return err_; }
  const std::string& path() const { return path_; }

 private:
  int err_;
  std::string path_;
};

// Bad input from the user (a hints file, a hostfile, an option): the message
// names the file and line or the device; the CLI exits 2 on it.
class InputError : public std::runtime_error {
 public:
  // "FILE:LINE: message", "FILE: message" (line 0) or "message" (no file).
  InputError(const std::string& file, int line, const std::string& message);
};

// "EPERM", "ENOENT", ...; "E<number>" for values without a symbolic name here.
std::string errno_name(int err);
// "Operation not permitted" (thread-safe strerror).
std::string errno_text(int err);

}  // namespace pod_init
