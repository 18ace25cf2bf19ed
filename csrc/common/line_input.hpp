// Line-oriented input files (hostfiles, topology hints): comments, blank lines
// and errors that name the line, shared so every file reads the same way.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace pod_init {

// The most a configuration file (a hostfile, hints, a tuning table) may hold.
inline constexpr size_t kMaxInputFile = 16 << 20;

// A whole configuration file, read to its end. Only regular files: a FIFO
// would block the open and a pipe may deliver in parts, so both are refused
// (-EINVAL) without waiting, as devices are; -EFBIG past `limit` bytes.
// Returns 0 or -errno.
int read_input_file(const std::string& path, std::string* out, size_t limit = kMaxInputFile);

// The same for the API layer: InputError naming the file for a FIFO, pipe,
// device or a file too large; SysError (errno, "read", path) otherwise.
std::string load_input_file(const std::string& path, size_t limit = kMaxInputFile);

// What `path` is when it is not a regular file (nor, with `block_devices`, a
// block device), as a message names it: "a FIFO or pipe", "a folder"; "" when
// it is one, or cannot be looked at.
std::string other_kind(const std::string& path, bool block_devices);

struct LineError {
  int line = 0;  // 1-based; 0: not tied to a line
  std::string message;
};

// Sets `error` and returns -EINVAL, so parsers can `return fail_line(...)`.
int fail_line(LineError* error, int line, std::string message);

// Calls `visit(line_number, line)` for every line, the newline cut off; stops
// at the first non-zero return and returns it.
int for_each_line(std::string_view text, const std::function<int(int, std::string_view)>& visit);

// Calls `visit(line_number, fields)` for every line that has content once `#`
// comments are cut and whitespace split it; stops at the first non-zero return.
int for_each_fields_line(std::string_view text,
                         const std::function<int(int, const std::vector<std::string>&)>& visit);

}  // namespace pod_init
