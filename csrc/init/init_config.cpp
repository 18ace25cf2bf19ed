#include "init/init_config.hpp"

#include "common/line_input.hpp"
#include "common/sysfs.hpp"
#include "common/text.hpp"

namespace pod_init {

namespace {

constexpr std::string_view kPrefix = "podinit.";
constexpr const char* kNameCharacters =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";

// Returns "" when the value was taken, else what is wrong with it.
std::string apply_one(const std::string& key, const std::string& value, InitConfig* config) {
  if (key == "cmd") {
    config->command = split_cmdline(value);
    return config->command.empty() ? "podinit.cmd= is empty" : "";
  }
  if (key == "modules" || key == "wait") {
    (key == "modules" ? config->modules : config->wait) = split_on(value, ',');
    return "";
  }
  if (key == "hostname") {
    if (value.empty() || value.size() > 64) return "podinit.hostname= must be 1 to 64 characters";
    config->hostname = value;
    return "";
  }
  if (key == "data" || key == "root") {
    if (value.empty()) return "podinit." + key + "= is empty";
    (key == "data" ? config->data : config->root) = value;
    return "";
  }
  if (key == "expect_gpus" || key == "grace") {
    auto number = sysfs::parse_int(value);
    long max = key == "grace" ? 3600 : 4096;
    if (!number || *number < 0 || *number > max) {
      return "podinit." + key + "= needs a whole number from 0 to " + std::to_string(max) +
             ", not '" + value + "'";
    }
    if (key == "grace") {
      config->grace_s = static_cast<unsigned>(*number);
    } else {
      config->expect_gpus = static_cast<int>(*number);
    }
    return "";
  }
  if (key == "end") {
    if (value == "poweroff") {
      config->end = EndAction::Poweroff;
    } else if (value == "reboot") {
      config->end = EndAction::Reboot;
    } else if (value == "halt") {
      config->end = EndAction::Halt;
    } else {
      return "podinit.end= must be poweroff, reboot or halt, not '" + value + "'";
    }
    return "";
  }
  if (key == "warm") {
    if (value == "on" || value == "off") {
      config->warm = value == "on";
      config->warm_preloads.clear();
      return "";
    }
    bool names = !value.empty() &&
                 value.find_first_not_of(std::string(kNameCharacters) + ".,") == std::string::npos;
    if (!names)
      return "podinit.warm= must be on, off or modules to preload (a,b.c), not '" + value + "'";
    config->warm = true;
    config->warm_preloads = value;
    return "";
  }
  if (key == "nvreg") {
    std::string joined;
    for (const std::string& item : split_on(value, ',')) {
      size_t equals = item.find('=');
      bool named = equals != std::string::npos && equals > 0 &&
                   item.find_first_not_of(kNameCharacters) >= equals &&
                   item.find_first_of(" \t\"", equals) == std::string::npos;
      if (!named)
        return "podinit.nvreg= takes NAME=VALUE items separated by commas, not '" + item + "'";
      joined += (joined.empty() ? "" : " ") + item;
    }
    if (joined.empty()) return "podinit.nvreg= is empty";
    config->nvreg = joined;
    return "";
  }
  if (key == "modules_lock") {
    if (value != "on" && value != "off") {
      return "podinit.modules_lock= must be on or off, not '" + value + "'";
    }
    config->modules_lock = value == "on";
    return "";
  }
  if (key == "gpu_wait") {
    auto number = sysfs::parse_int(value);
    if (!number || *number < 1 || *number > 3600) {
      return "podinit.gpu_wait= needs a whole number of seconds from 1 to 3600, not '" + value +
             "'";
    }
    config->gpu_wait_s = static_cast<unsigned>(*number);
    return "";
  }
  if (key == "sysfs") {
    if (value.empty() || value[0] != '/') return "podinit.sysfs= needs an absolute path";
    config->sysfs_root = value;
    return "";
  }
  return "unknown parameter podinit." + key +
         " (known: cmd, modules, wait, hostname, data, root, expect_gpus, end, grace, warm, "
         "nvreg, modules_lock, gpu_wait, sysfs)";
}

// "podinit.key=value" → apply; a word without '=' is an error too.
std::string apply_word(const std::string& word, InitConfig* config) {
  size_t equals = word.find('=');
  if (equals == std::string::npos) return "podinit parameter without a value: '" + word + "'";
  return apply_one(word.substr(kPrefix.size(), equals - kPrefix.size()), word.substr(equals + 1),
                   config);
}

}  // namespace

std::vector<std::string> split_cmdline(std::string_view text) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false, in_word = false;
  for (char c : text) {
    if (c == '"') {
      quoted = !quoted;
      in_word = true;
    } else if (!quoted && (c == ' ' || c == '\t' || c == '\n')) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

void apply_init_params(const std::vector<std::string>& words, const std::string& source,
                       InitConfig* config, std::vector<std::string>* errors) {
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--") {
      config->command.assign(words.begin() + static_cast<long>(i) + 1, words.end());
      return;
    }
    if (words[i].rfind(kPrefix, 0) != 0) continue;
    std::string problem = apply_word(words[i], config);
    if (!problem.empty()) errors->push_back(source + ": " + problem);
  }
}

void apply_init_line(std::string_view line, const std::string& where, InitConfig* config,
                     std::vector<std::string>* errors) {
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  // A comment is a whole line: a value keeps its '#' (podinit.cmd=/bin/train --tag=#3).
  if (!line.empty() && line.front() == '#') return;
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) {
    line.remove_suffix(1);
  }
  if (line.empty()) return;
  if (line.rfind(kPrefix, 0) != 0 || line.find('=') == std::string_view::npos) {
    errors->push_back(where + ": expected podinit.KEY=VALUE, got '" + std::string(line) + "'");
    return;
  }
  // The value is the rest of the line, so podinit.cmd= needs no quotes here.
  std::string problem = apply_word(std::string(line), config);
  if (!problem.empty()) errors->push_back(where + ": " + problem);
}

void apply_init_file(std::string_view text, const std::string& path, InitConfig* config,
                     std::vector<std::string>* errors) {
  for_each_line(text, [&](int number, std::string_view line) {
    apply_init_line(line, path + ":" + std::to_string(number), config, errors);
    return 0;
  });
}

const char* end_action_name(EndAction action) {
  switch (action) {
    case EndAction::Poweroff:
      return "poweroff";
    case EndAction::Reboot:
      return "reboot";
    case EndAction::Halt:
      return "halt";
  }
  return "poweroff";
}

}  // namespace pod_init
