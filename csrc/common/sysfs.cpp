#include "common/sysfs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace pod_init::sysfs {

namespace {

bool is_regular(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

int open_attribute(const std::string& path) {
  // O_NONBLOCK: a FIFO in a tree (a fixture, a hostile --sysfs-root) opens at
  // once and reads as empty instead of waiting for a writer. No fstat here: the
  // scan is bound by system calls, and only an empty read needs the check.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  return fd < 0 ? -errno : fd;
}

int read_text(const std::string& path, std::string* out, size_t limit) {
  int fd = open_attribute(path);
  if (fd < 0) return fd;
  std::string text;
  char buf[4096];
  int result = 0;
  while (text.size() < limit) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      result = -errno;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
    // sysfs returns an attribute in one read; a short read is the end.
    if (static_cast<size_t>(n) < sizeof buf) break;
  }
  if ((result == -EAGAIN || (result == 0 && text.empty())) && !is_regular(fd)) {
    result = -EINVAL;  // a FIFO or a device, not an attribute
  }
  ::close(fd);
  if (result < 0) return result;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\t')) {
    text.pop_back();
  }
  *out = std::move(text);
  return 0;
}

int read_link(const std::string& path, std::string* out) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  if (n < 0) return -errno;
  if (static_cast<size_t>(n) == sizeof buf) return -ENAMETOOLONG;
  out->assign(buf, static_cast<size_t>(n));
  return 0;
}

int resolve(const std::string& path, std::string* out) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return -errno;
  out->assign(buf);
  return 0;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (end > start) parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

std::string normalize_path(std::string_view path) {
  std::vector<std::string_view> parts;
  for (std::string_view part : split_path(path)) {
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (part != ".") {
      parts.push_back(part);
    }
  }
  std::string out;
  for (std::string_view part : parts) {
    out += '/';
    out += part;
  }
  return out.empty() ? "/" : out;
}

int resolve_link(const std::string& path, std::string* out) {
  std::string target;
  int rc = read_link(path, &target);
  if (rc == -EINVAL) {
    target = path;  // not a link
  } else if (rc < 0) {
    return rc;
  } else if (target.empty() || target[0] != '/') {
    target = path.substr(0, path.rfind('/') + 1) + target;
  }
  std::string resolved = normalize_path(target);
  if (::access(resolved.c_str(), F_OK) < 0) return -errno;
  *out = std::move(resolved);
  return 0;
}

int list_dir(const std::string& path, std::vector<std::string>* names) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return -errno;
  names->clear();
  errno = 0;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view name(entry->d_name);
    if (name != "." && name != "..") names->emplace_back(name);
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return -err;
  std::sort(names->begin(), names->end());
  return 0;
}

namespace {

std::optional<uint64_t> parse_digits(std::string_view text, int base) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  // A digit first: strtoull would skip leading whitespace, so " 5" passed.
  auto first = static_cast<unsigned char>(text[0]);
  if (!(base == 16 ? std::isxdigit(first) : std::isdigit(first))) return std::nullopt;
  std::string copy(text);
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(copy.c_str(), &end, base);
  if (errno != 0 || end != copy.c_str() + copy.size() || copy[0] == '-' || copy[0] == '+') {
    return std::nullopt;
  }
  return static_cast<uint64_t>(value);
}

}  // namespace

std::optional<uint64_t> parse_hex(std::string_view text) {
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))
    text.remove_prefix(2);
  return parse_digits(text, 16);
}

std::optional<int64_t> parse_int(std::string_view text) {
  bool negative = !text.empty() && text[0] == '-';
  if (negative) text.remove_prefix(1);
  auto value = parse_digits(text, 10);
  if (!value || *value > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  auto signed_value = static_cast<int64_t>(*value);
  return negative ? -signed_value : signed_value;
}

std::optional<double> parse_link_speed(std::string_view text) {
  auto unit = text.find(" GT/s");
  if (unit == std::string_view::npos || unit == 0) return std::nullopt;
  std::string number(text.substr(0, unit));
  char* end = nullptr;
  double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !(value > 0.0) || value > 1000.0) {
    return std::nullopt;
  }
  return value;
}

std::string_view basename(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool is_bdf(std::string_view name) {
  // domain ':' bus(2) ':' device(2) '.' function(1)
  auto first_colon = name.find(':');
  if (first_colon == std::string_view::npos || first_colon < 4) return false;
  std::string_view rest = name.substr(first_colon);
  if (rest.size() != 8 || rest[0] != ':' || rest[3] != ':' || rest[6] != '.') return false;
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  for (size_t i = 0; i < first_colon; ++i) {
    if (!hex(name[i])) return false;
  }
  return hex(rest[1]) && hex(rest[2]) && hex(rest[4]) && hex(rest[5]) && rest[7] >= '0' &&
         rest[7] <= '7';
}

std::string last_bdf_component(std::string_view path) {
  std::string found;
  for (std::string_view part : split_path(path)) {
    if (is_bdf(part)) found = std::string(part);
  }
  return found;
}

}  // namespace pod_init::sysfs
