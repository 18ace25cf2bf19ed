// Files that are either whole or absent: write a temporary name in the same
// folder, fsync, rename over the target.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pod_init {

// Creates `dir` and its parents as needed. Returns 0 or -errno.
int make_directories(const std::string& dir);

// Returns 0 or -errno; on failure the target is untouched and no temporary is left.
int write_file_atomically(const std::string& path, const std::string& content);
// A set of files (path, content) published together: all are written and
// synced under temporary names first, then renamed, so a full disk leaves
// the previous set whole. 0, or -errno with *failed naming the file.
int write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files,
                           std::string* failed);

// Puts the folder `staged` (complete and synced) in place of `target` in one
// step: a plain rename when `target` does not exist, else an exchange of the
// two (renameat2 RENAME_EXCHANGE), after which `staged` names the previous
// version for the caller to remove. Either way a reader of `target` sees the
// old folder or the new one, never neither. The parent folder is synced.
// 0 or -errno; *failed names what the failing call was about.
int publish_directory(const std::string& staged, const std::string& target, bool* replaced,
                      std::string* failed);

}  // namespace pod_init
