// Error conventions: functions below the API layer return 0 or -errno and never
// touch the global errno; the API layer (scan(), the binding, the CLI) turns a
// negative result into a SysError exactly once. The errno, the operation and
// the path travel separately until a message is made, so Python gets the right
// OSError subclass with .filename set to the path, never to an operation.
#pragma once

#include <stdexcept>
#include <string>

namespace pod_init {

class SysError : public std::runtime_error {
 public:
  // `operation`: what failed ("open", "mount", "getifaddrs"); `path`: the file
  // or device it failed on, "" when there is none.
  SysError(int err, std::string operation, std::string path = "");
  int err() const { return err_; }
  const std::string& operation() const { return operation_; }
  const std::string& path() const { return path_; }

 private:
  int err_;
  std::string operation_;
  std::string path_;
};

// Bad input from the user (a hints file's content, a hostfile line, an
// option): the CLI exits 2 on it, Python sees pyinit.errors.InputError (a
// ValueError). A file that cannot be read at all is a SysError, not this.
class InputError : public std::runtime_error {
 public:
  // what(): "FILE:LINE: message", "FILE: message" (line 0) or "message" (no file).
  InputError(std::string file, int line, std::string message);
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_;
  int line_;
  std::string message_;
};

// InputError for a path holding a NUL byte: the kernel would stop at it and
// open another file than the one named.
void check_path(const std::string& path);

// "EPERM", "ENOENT", ...; "E<number>" for values without a symbolic name here.
std::string errno_name(int err);
// "Operation not permitted" (thread-safe strerror).
std::string errno_text(int err);

}  // namespace pod_init
