#include "pod_init/error.hpp"

#include <cerrno>
#include <cstring>

namespace pod_init {

SysError::SysError(int err, std::string path)
    : std::runtime_error(path + ": " + errno_text(err)), err_(err), path_(std::move(path)) {}

namespace {

std::string located(const std::string& file, int line, const std::string& message) {
  if (file.empty()) return message;
  return file + (line > 0 ? ":" + std::to_string(line) : "") + ": " + message;
}

}  // namespace

InputError::InputError(const std::string& file, int line, const std::string& message)
    : std::runtime_error(located(file, line, message)) {}

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

}  // namespace pod_init
