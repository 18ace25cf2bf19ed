// What a set of files is on disk now (modification time, size, inode), and
// later the first of them that is no longer so: how a warm interpreter knows
// that a module it imported has been edited or replaced since. It checks
// thousands of files at every launch, so the loop is here, one stat() a file,
// spread over threads that end before the check returns.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pod_init {

class FileSnapshot {
 public:
  // Each of `paths` as it is now; one that cannot be stat'ed is left out.
  explicit FileSnapshot(const std::vector<std::string>& paths);

  struct Change {
    ssize_t index = -1;  // into paths(); -1: none changed
    int err = 0;         // stat()'s errno when the file is gone or unreadable, else 0
  };
  // The first file whose time, size or inode differs from the snapshot, or
  // that can no longer be stat'ed.
  Change first_change() const;
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  struct State {
    int64_t mtime_ns;
    int64_t size;
    uint64_t inode;
    bool operator==(const State& other) const {
      return mtime_ns == other.mtime_ns && size == other.size && inode == other.inode;
    }
  };
  static int state_of(const std::string& path, State* state);  // 0 or -errno
  Change first_change_in(size_t begin, size_t end) const;

  std::vector<std::string> paths_;
  std::vector<State> states_;
};

}  // namespace pod_init
