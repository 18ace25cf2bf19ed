// Files that are either whole or absent: write a temporary name in the same
// folder, fsync, rename over the target.
#pragma once

#include <string>

namespace pod_init {

// Creates `dir` and its parents as needed. Returns 0 or -errno.
int make_directories(const std::string& dir);

// Returns 0 or -errno; on failure the target is untouched and no temporary is left.
int write_file_atomically(const std::string& path, const std::string& content);

}  // namespace pod_init
