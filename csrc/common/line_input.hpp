// Line-oriented input files (hostfiles, topology hints): comments, blank lines
// and errors that name the line, shared so every file reads the same way.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace pod_init {

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
