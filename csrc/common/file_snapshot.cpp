#include "common/file_snapshot.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

namespace pod_init {

int FileSnapshot::state_of(const std::string& path, State* state) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return -errno;
  *state = {static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec,
            static_cast<int64_t>(info.st_size), static_cast<uint64_t>(info.st_ino)};
  return 0;
}

FileSnapshot::FileSnapshot(const std::vector<std::string>& paths) {
  paths_.reserve(paths.size());
  states_.reserve(paths.size());
  for (const std::string& path : paths) {
    State state{};
    if (state_of(path, &state) != 0) continue;
    paths_.push_back(path);
    states_.push_back(state);
  }
}

FileSnapshot::Change FileSnapshot::first_change_in(size_t begin, size_t end) const {
  for (size_t i = begin; i < end; ++i) {
    State now{};
    int rc = state_of(paths_[i], &now);
    if (rc != 0) return {static_cast<ssize_t>(i), -rc};
    if (!(now == states_[i])) return {static_cast<ssize_t>(i), 0};
  }
  return {};
}

// A stat() costs 1-2 us on a VM (4,000 files: 6-9 ms of a launch's handoff),
// nearly all of it in the kernel, so the files are split among threads, all
// joined before this returns: the caller may fork right after.
FileSnapshot::Change FileSnapshot::first_change() const {
  constexpr size_t kFilesPerThread = 512;
  constexpr size_t kMaxThreads = 8;
  size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
  size_t parts =
      std::min({kMaxThreads, cores, (paths_.size() + kFilesPerThread - 1) / kFilesPerThread});
  if (parts <= 1) return first_change_in(0, paths_.size());
  std::vector<Change> found(parts);
  std::vector<std::thread> threads;
  size_t step = (paths_.size() + parts - 1) / parts;
  for (size_t part = 1; part < parts; ++part) {
    threads.emplace_back([this, &found, part, step] {
      found[part] = first_change_in(part * step, std::min(paths_.size(), (part + 1) * step));
    });
  }
  found[0] = first_change_in(0, step);
  for (std::thread& thread : threads) thread.join();
  for (const Change& change : found) {
    if (change.index >= 0) return change;  // the parts are in order: the first is the lowest
  }
  return {};
}

}  // namespace pod_init
