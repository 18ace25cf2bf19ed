// A command line described by a table: each subcommand's options, with the
// value each takes and, for numbers, its range. The parser checks every value
// against the table, and the usage and --help text are made from the same
// table, so a range is written once (from the core's constants).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pod_init {

struct CommandOption {
  const char* name;              // "--channels"
  const char* value;             // its placeholder ("N", "DIR"); nullptr: a flag
  const char* help;              // one line; the range is added for numbers
  const char* number = nullptr;  // what a number is called ("a whole number"); nullptr: text
  int64_t min = 0;
  int64_t max = 0;
  bool repeatable = false;  // given more than once, every value is kept
};

struct CommandSpec {
  const char* name;      // "" for the command line's own options (pod-init -- CMD)
  const char* operands;  // what follows the options in the usage line ("PATH", "NAME...")
  std::vector<CommandOption> options;
  const char* text;  // what the command does, for --help
  // Operands come only after "--", which ends the options (the supervisor's command).
  bool operands_after_dashes = false;
};

// What a command line said, its values already checked against the table.
struct ParsedCommand {
  bool help = false;                                       // -h or --help: nothing else was checked
  std::map<std::string, std::vector<std::string>> values;  // option -> its values
  std::vector<std::string> operands;

  bool has(const std::string& option) const { return values.count(option) > 0; }
  // The option's (last) value, or `fallback` when it was not given.
  std::string text(const std::string& option, const std::string& fallback = "") const;
  int64_t number(const std::string& option, int64_t fallback) const;
  std::vector<int64_t> numbers(const std::string& option) const;
};

// Parses `args` (after the subcommand's name) by `spec`. A usage problem is
// one line in *error: the option and what it needs, with the range.
std::optional<ParsedCommand> parse_command(const CommandSpec& spec,
                                           const std::vector<std::string>& args,
                                           std::string* error);

// "pod-init NAME [--opt VALUE] ... OPERANDS", wrapped at 80 columns.
std::string usage_line(const char* program, const CommandSpec& spec);
// The command's text, then a line per option with its range.
std::string option_help(const CommandSpec& spec);

}  // namespace pod_init
