#include "common/command_line.hpp"

#include <algorithm>
#include <cstdint>

#include "common/sysfs.hpp"

namespace pod_init {

namespace {

const CommandOption* find_option(const CommandSpec& spec, const std::string& name) {
  auto it = std::find_if(spec.options.begin(), spec.options.end(),
                         [&](const CommandOption& o) { return name == o.name; });
  return it == spec.options.end() ? nullptr : &*it;
}

// "1 to 32", or "0 or more" where the top is only the type's.
std::string range_text(const CommandOption& option) {
  if (option.max == INT64_MAX) return std::to_string(option.min) + " or more";
  return std::to_string(option.min) + " to " + std::to_string(option.max);
}

// "--channels needs a whole number from 1 to 32", "--out needs a DIR".
std::string needs(const CommandOption& option) {
  if (option.number == nullptr) return std::string(option.name) + " needs a " + option.value;
  const std::string range = range_text(option);
  return std::string(option.name) + " needs " + option.number +
         (option.max == INT64_MAX ? ", " : " from ") + range;
}

bool good_value(const CommandOption& option, const std::string& value) {
  if (option.number == nullptr) return !value.empty();
  auto number = sysfs::parse_int(value);
  return number && *number >= option.min && *number <= option.max;
}

}  // namespace

std::string ParsedCommand::text(const std::string& option, const std::string& fallback) const {
  auto it = values.find(option);
  return it == values.end() ? fallback : it->second.back();
}

int64_t ParsedCommand::number(const std::string& option, int64_t fallback) const {
  auto it = values.find(option);
  // Checked by parse_command against the option's range.
  return it == values.end() ? fallback : *sysfs::parse_int(it->second.back());
}

std::vector<int64_t> ParsedCommand::numbers(const std::string& option) const {
  std::vector<int64_t> out;
  auto it = values.find(option);
  if (it != values.end()) {
    for (const std::string& value : it->second) out.push_back(*sysfs::parse_int(value));
  }
  return out;
}

std::optional<ParsedCommand> parse_command(const CommandSpec& spec,
                                           const std::vector<std::string>& args,
                                           std::string* error) {
  ParsedCommand parsed;
  const std::string prefix = *spec.name ? std::string(spec.name) + ": " : "";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      parsed.help = true;
      return parsed;
    }
    if (arg == "--") {  // the options end here, for every command
      std::vector<std::string> rest(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      if (!spec.operands_after_dashes && *spec.operands == '\0' && !rest.empty()) {
        *error = prefix + "unexpected argument '" + rest.front() + "'";
        return std::nullopt;
      }
      parsed.operands.insert(parsed.operands.end(), rest.begin(), rest.end());
      return parsed;
    }
    const CommandOption* option = find_option(spec, arg);
    if (option == nullptr) {
      if (arg.empty() || arg[0] != '-') {
        if (spec.operands_after_dashes || *spec.operands == '\0') {
          *error = prefix + "unexpected argument '" + arg + "'";
          return std::nullopt;
        }
        parsed.operands.push_back(arg);
        continue;
      }
      *error = prefix + "unknown option '" + arg + "'";
      return std::nullopt;
    }
    std::vector<std::string>& values = parsed.values[arg];
    if (option->value == nullptr) {
      values.assign(1, "");
      continue;
    }
    if (i + 1 >= args.size() || !good_value(*option, args[i + 1])) {
      *error = needs(*option);
      return std::nullopt;
    }
    if (!option->repeatable) values.clear();
    values.push_back(args[++i]);
  }
  return parsed;
}

std::string usage_line(const char* program, const CommandSpec& spec) {
  std::string head = std::string(program) + (*spec.name ? std::string(" ") + spec.name : "");
  std::vector<std::string> words;
  for (const CommandOption& option : spec.options) {
    std::string word = std::string("[") + option.name;
    if (option.value != nullptr) word += std::string(" ") + option.value;
    word += option.repeatable ? "]..." : "]";
    words.push_back(word);
  }
  if (*spec.operands) words.emplace_back(spec.operands);
  // The first line follows "usage: "; the others start under the first option.
  constexpr size_t kWidth = 80, kUsage = 7;
  const std::string indent(kUsage + head.size() + 1, ' ');
  std::string out = head;
  size_t column = kUsage + head.size();
  for (const std::string& word : words) {
    if (column + 1 + word.size() > kWidth) {
      out += "\n" + indent;
      column = indent.size();
    } else {
      out += " ";
      ++column;
    }
    out += word;
    column += word.size();
  }
  return out + "\n";
}

std::string option_help(const CommandSpec& spec) {
  std::string out = spec.text;
  for (const CommandOption& option : spec.options) {
    std::string left = std::string("  ") + option.name;
    if (option.value != nullptr) left += std::string(" ") + option.value;
    std::string line = left.size() < 24 ? left + std::string(24 - left.size(), ' ')
                                        : left + "\n" + std::string(24, ' ');
    line += option.help;
    if (option.number != nullptr) {
      line += " (" + range_text(option) + ")";
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace pod_init
