#include <gtest/gtest.h>

#include <cstdint>

#include "common/command_line.hpp"

namespace pod_init {
namespace {

const CommandSpec kSpec = {"nccl",
                           "NAME...",
                           {{"--out", "DIR", "where the files go"},
                            {"--channels", "N", "ring channels", "a whole number", 1, 32},
                            {"-e", "CODE", "counts as 0", "an exit status", 0, 255, true},
                            {"--force", nullptr, "no questions"}},
                           "Writes files.\n"};

std::optional<ParsedCommand> parse(std::vector<std::string> args, std::string* error) {
  return parse_command(kSpec, args, error);
}

TEST(CommandLine, ValuesFlagsAndOperands) {
  std::string error;
  auto parsed =
      parse({"--out", "o", "a", "--force", "--channels", "8", "b", "-e", "3", "-e", "4"}, &error);
  ASSERT_TRUE(parsed) << error;
  EXPECT_EQ(parsed->text("--out"), "o");
  EXPECT_EQ(parsed->number("--channels", 0), 8);
  EXPECT_EQ(parsed->numbers("-e"), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(parsed->has("--force"));
  EXPECT_EQ(parsed->operands, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(parsed->text("--missing", "fallback"), "fallback");
}

TEST(CommandLine, EveryValueIsCheckedAgainstTheTable) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--channels", "33"}, "--channels needs a whole number from 1 to 32"},
      {{"--channels", "0x4"}, "--channels needs a whole number from 1 to 32"},
      {{"--channels"}, "--channels needs a whole number from 1 to 32"},
      {{"-e", "256"}, "-e needs an exit status from 0 to 255"},
      {{"--out", ""}, "--out needs a DIR"},
      {{"--out"}, "--out needs a DIR"},
      {{"--bogus"}, "nccl: unknown option '--bogus'"},
      // strtoull would skip the space: a value is the number alone.
      {{"--channels", " 5"}, "--channels needs a whole number from 1 to 32"},
      {{"-e", "\t5"}, "-e needs an exit status from 0 to 255"},
  };
  for (const auto& [args, message] : cases) {
    std::string error;
    EXPECT_FALSE(parse(args, &error));
    EXPECT_EQ(error, message);
  }
}

TEST(CommandLine, HelpStopsTheParse) {
  std::string error;
  auto parsed = parse({"--channels", "99", "--help"}, &error);
  EXPECT_FALSE(parsed);  // the bad value came first
  parsed = parse({"--help", "--channels", "99"}, &error);
  ASSERT_TRUE(parsed);
  EXPECT_TRUE(parsed->help);
}

TEST(CommandLine, UsageAndHelpComeFromTheTable) {
  EXPECT_EQ(usage_line("pod-init", kSpec),
            "pod-init nccl [--out DIR] [--channels N] [-e CODE]... [--force] NAME...\n");
  std::string help = option_help(kSpec);
  EXPECT_EQ(help.rfind("Writes files.\n", 0), 0u);
  EXPECT_NE(help.find("  --channels N          ring channels (1 to 32)\n"), std::string::npos);
}

TEST(CommandLine, LongUsageWrapsUnderTheCommand) {
  CommandSpec wide = kSpec;
  for (int i = 0; i < 3; ++i)
    wide.options.insert(wide.options.end(), kSpec.options.begin(), kSpec.options.end());
  std::string usage = usage_line("pod-init", wide);
  size_t start = 0;
  while (start < usage.size()) {
    size_t end = usage.find('\n', start);
    EXPECT_LE(end - start + (start == 0 ? 7 : 0), 80u);
    if (start > 0) {
      EXPECT_EQ(usage.substr(start, 22), std::string(21, ' ') + "[");
    }
    start = end + 1;
  }
}

TEST(CommandLine, DashesEndTheSupervisorsOptions) {
  CommandSpec wrapper = {"", "-- COMMAND [ARGS...]", {{"-v", nullptr, "verbose"}}, "", true};
  std::string error;
  auto parsed = parse_command(wrapper, {"-v", "--", "sleep", "-v", "1"}, &error);
  ASSERT_TRUE(parsed) << error;
  EXPECT_EQ(parsed->operands, (std::vector<std::string>{"sleep", "-v", "1"}));
  EXPECT_FALSE(parse_command(wrapper, {"sleep"}, &error));
  EXPECT_EQ(error, "unexpected argument 'sleep'");
}

TEST(CommandLine, DashesEndEveryCommandsOptions) {
  std::string error;
  auto parsed = parse({"--force", "--", "-x", "--out"}, &error);
  ASSERT_TRUE(parsed) << error;
  EXPECT_EQ(parsed->operands, (std::vector<std::string>{"-x", "--out"}));
  EXPECT_FALSE(parsed->has("--out"));
  CommandSpec no_operands = {"topo", "", {{"--force", nullptr, "no questions"}}, ""};
  EXPECT_TRUE(parse_command(no_operands, {"--force", "--"}, &error));
  EXPECT_FALSE(parse_command(no_operands, {"--", "-x"}, &error));
  EXPECT_EQ(error, "topo: unexpected argument '-x'");
}

}  // namespace
}  // namespace pod_init
