#include "common/error.hpp"

#include <cerrno>
#include <cstring>

#include "common/text.hpp"

namespace pod_init {

namespace {

std::string located(const std::string& file, int line, const std::string& message) {
  if (file.empty()) return message;
  return file + (line > 0 ? ":" + std::to_string(line) : "") + ": " + message;
}

}  // namespace

// "PATH: OPERATION: text", or "OPERATION: text" without a path.
SysError::SysError(int err, std::string operation, std::string path)
    : std::runtime_error(printable(located(path, 0, operation + ": " + errno_text(err)))),
      err_(err),
      operation_(std::move(operation)),
      path_(std::move(path)) {}

// Messages quote what users wrote (a hints line, a hostfile field): printable()
// keeps stray bytes off the terminal.
InputError::InputError(std::string file, int line, std::string message)
    : std::runtime_error(printable(located(file, line, message))),
      file_(std::move(file)),
      line_(line),
      message_(std::move(message)) {}

std::string errno_name(int err) {
  switch (err) {
    case EPERM:
      return "EPERM";
    case ENOENT:
      return "ENOENT";
    case EIO:
      return "EIO";
    case EACCES:
      return "EACCES";
    case EBUSY:
      return "EBUSY";
    case ENODEV:
      return "ENODEV";
    case ENOTDIR:
      return "ENOTDIR";
    case EISDIR:
      return "EISDIR";
    case EINVAL:
      return "EINVAL";
    case ENOMEM:
      return "ENOMEM";
    case ENXIO:
      return "ENXIO";
    case ELOOP:
      return "ELOOP";
    case ENAMETOOLONG:
      return "ENAMETOOLONG";
    case EOPNOTSUPP:
      return "EOPNOTSUPP";
    default:
      return "E" + std::to_string(err);
  }
}

std::string errno_text(int err) {
  char buf[128];
  // GNU strerror_r returns the message pointer, which may not be buf.
  return strerror_r(err, buf, sizeof buf);
}

void check_path(const std::string& path) {
  if (path.find('\0') != std::string::npos) {
    throw InputError(path, 0, "a path with a NUL byte (the kernel would open another file)");
  }
}

}  // namespace pod_init
