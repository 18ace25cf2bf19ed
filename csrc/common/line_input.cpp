#include "common/line_input.hpp"

#include <cerrno>

namespace pod_init {

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
