#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace pod_init {

int make_directories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0755) < 0 && errno != EEXIST) return -errno;
    if (slash == std::string::npos) break;
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) < 0) return -errno;
  return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

int write_file_atomically(const std::string& path, const std::string& content) {
  size_t slash = path.rfind('/');
  std::string temp = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                     "." + path.substr(slash == std::string::npos ? 0 : slash + 1) + ".XXXXXX";
  int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = 0;
  for (size_t done = 0; done < content.size() && rc == 0;) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno != EINTR) rc = -errno;
    if (n > 0) done += static_cast<size_t>(n);
  }
  // mkostemp makes 0600; these files are meant to be read by the workload's user too.
  if (rc == 0 && fchmod(fd, 0644) < 0) rc = -errno;
  if (rc == 0 && fsync(fd) < 0) rc = -errno;
  if (close(fd) < 0 && rc == 0) rc = -errno;
  if (rc == 0 && rename(temp.c_str(), path.c_str()) < 0) rc = -errno;
  if (rc < 0) unlink(temp.c_str());
  return rc;
}

}  // namespace pod_init
