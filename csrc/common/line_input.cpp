#include "common/line_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "common/error.hpp"

namespace pod_init {

int read_input_file(const std::string& path, std::string* out, size_t limit) {
  // O_NONBLOCK: opening a FIFO without a writer must not wait for one.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -errno;
  struct stat st {};
  int result = 0;
  if (fstat(fd, &st) != 0) {
    result = -errno;
  } else if (!S_ISREG(st.st_mode)) {
    result = -EINVAL;
  } else if (static_cast<uint64_t>(st.st_size) > limit) {
    result = -EFBIG;
  }
  std::string text;
  char buf[1 << 16];
  while (result == 0) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) result = -errno;
    if (n <= 0) break;
    if (text.size() + static_cast<size_t>(n) > limit) result = -EFBIG;  // grew while read
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (result == 0) *out = std::move(text);
  return result;
}

std::string other_kind(const std::string& path, bool block_devices) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return "";
  if (S_ISBLK(info.st_mode)) return block_devices ? "" : "a block device";
  if (S_ISDIR(info.st_mode)) return "a folder";
  if (S_ISFIFO(info.st_mode)) return "a FIFO or pipe";
  if (S_ISCHR(info.st_mode)) return "a character device";
  if (S_ISSOCK(info.st_mode)) return "a socket";
  return "something else";
}

namespace {

// The one line for an input that is not a regular file: what it is.
std::string not_regular(const std::string& path) {
  std::string kind = other_kind(path, false);
  return (kind.empty() ? "something else" : kind) +
         ", not a regular file: give the path of a file to read";
}

}  // namespace

std::string load_input_file(const std::string& path, size_t limit) {
  check_path(path);
  std::string text;
  int rc = read_input_file(path, &text, limit);
  if (rc == -EINVAL) throw InputError(path, 0, not_regular(path));
  if (rc == -EFBIG) {
    throw InputError(path, 0, "larger than " + std::to_string(limit >> 20) + " MiB");
  }
  if (rc < 0) throw SysError(-rc, "read", path);
  return text;
}

int fail_line(LineError* error, int line, std::string message) {
  *error = {line, std::move(message)};
  return -EINVAL;
}

int for_each_line(std::string_view text, const std::function<int(int, std::string_view)>& visit) {
  int line_no = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    int rc = visit(++line_no, text.substr(start, end - start));
    if (rc != 0) return rc;
    start = end + 1;
  }
  return 0;
}

int for_each_fields_line(std::string_view text,
                         const std::function<int(int, const std::vector<std::string>&)>& visit) {
  return for_each_line(text, [&](int line_no, std::string_view line) {
    line = line.substr(0, line.find('#'));
    std::vector<std::string> fields;
    size_t pos = 0;
    while (pos < line.size()) {
      size_t begin = line.find_first_not_of(" \t\r", pos);
      if (begin == std::string_view::npos) break;
      size_t stop = line.find_first_of(" \t\r", begin);
      if (stop == std::string_view::npos) stop = line.size();
      fields.emplace_back(line.substr(begin, stop - begin));
      pos = stop;
    }
    return fields.empty() ? 0 : visit(line_no, fields);
  });
}

}  // namespace pod_init
