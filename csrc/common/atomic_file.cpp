#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <stdio.h>
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

namespace {

// Writes `content` to a new temporary file beside `path` and syncs it; its
// name in *temp. 0 or -errno (and no temporary left).
int stage(const std::string& path, const std::string& content, std::string* temp) {
  size_t slash = path.rfind('/');
  *temp = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "." +
          path.substr(slash == std::string::npos ? 0 : slash + 1) + ".XXXXXX";
  int fd = mkostemp(temp->data(), O_CLOEXEC);
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
  if (rc < 0) unlink(temp->c_str());
  return rc;
}

}  // namespace

int write_file_atomically(const std::string& path, const std::string& content) {
  std::string failed;
  return write_files_atomically({{path, content}}, &failed);
}

int write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files,
                           std::string* failed) {
  std::vector<std::string> temps;
  for (const auto& [path, content] : files) {
    std::string temp;
    int rc = stage(path, content, &temp);
    if (rc < 0) {
      // Nothing of the set is published: every staged file goes.
      for (const std::string& staged : temps) unlink(staged.c_str());
      *failed = path;
      return rc;
    }
    temps.push_back(temp);
  }
  // Renames in one folder do not run out of space: once all are staged, all land.
  for (size_t i = 0; i < files.size(); ++i) {
    if (rename(temps[i].c_str(), files[i].first.c_str()) < 0) {
      int rc = -errno;
      for (size_t j = i; j < temps.size(); ++j) unlink(temps[j].c_str());
      *failed = files[i].first;
      return rc;
    }
  }
  return 0;
}

int publish_directory(const std::string& staged, const std::string& target, bool* replaced,
                      std::string* failed) {
  *replaced = false;
  *failed = target;
  if (rename(staged.c_str(), target.c_str()) < 0) {
    // A folder that exists and holds something cannot be renamed over; an
    // exchange swaps the two names in one step instead.
    if (errno != ENOTEMPTY && errno != EEXIST) return -errno;
    if (renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) < 0) {
      return -errno;
    }
    *replaced = true;
  }
  size_t slash = target.rfind('/');
  std::string parent = slash == std::string::npos ? "." : target.substr(0, slash + 1);
  int fd = open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *failed = parent;
    return -errno;
  }
  int rc = fsync(fd) < 0 ? -errno : 0;
  close(fd);
  if (rc < 0) *failed = parent;
  return rc;
}

}  // namespace pod_init
