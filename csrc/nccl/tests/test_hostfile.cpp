#include <gtest/gtest.h>

#include "nccl/hostfile.hpp"

namespace pod_init {
namespace {

TEST(Hostfile, ParsesAddressesSlotsAndComments) {
  std::vector<HostEntry> hosts;
  LineError error;
  const char* text =
      "# training nodes\n"
      "10.0.0.2 slots=8\n"
      "\n"
      "  10.0.0.3   # rack 2\n"
      "fd00::0:1 slots=4\r\n";
  ASSERT_EQ(parse_hostfile(text, false, &hosts, &error), 0) << error.message;
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].address, "10.0.0.2");
  EXPECT_EQ(hosts[0].slots, 8);
  EXPECT_EQ(hosts[0].line, 2);
  EXPECT_EQ(hosts[1].address, "10.0.0.3");
  EXPECT_EQ(hosts[1].slots, 0);
  EXPECT_EQ(hosts[2].address, "fd00::1");  // canonical form
  EXPECT_EQ(hosts_lines(hosts), "10.0.0.2 node-0\n10.0.0.3 node-1\nfd00::1 node-2\n");
}

TEST(Hostfile, ExpandsCompressedListsOnALine) {
  std::vector<HostEntry> hosts;
  LineError error;
  ASSERT_EQ(parse_hostfile("10.0.0.[1-3] slots=8\n10.0.1.1\n", false, &hosts, &error), 0)
      << error.message;
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[2].address, "10.0.0.3");
  EXPECT_EQ(hosts[2].slots, 8);
  EXPECT_EQ(hosts[2].line, 1);
  EXPECT_EQ(hosts[3].line, 2);
  EXPECT_EQ(parse_hostfile("10.0.0.1\n10.0.0.[0-1]\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(error.line, 2);
  EXPECT_NE(error.message.find("duplicate host 10.0.0.1"), std::string::npos);
  EXPECT_EQ(parse_hostfile("10.0.0.[1-\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(error.line, 1);
}

TEST(Hostfile, ErrorsNameTheLine) {
  std::vector<HostEntry> hosts;
  LineError error;
  EXPECT_EQ(parse_hostfile("10.0.0.1\n10.0.0.2\n10.0.0.1\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(error.line, 3);
  EXPECT_NE(error.message.find("first on line 1"), std::string::npos);

  EXPECT_EQ(parse_hostfile("10.0.0.1\ngpu-node-7\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(error.line, 2);
  EXPECT_NE(error.message.find("not an IP address"), std::string::npos);
  EXPECT_EQ(parse_hostfile("10.0.0.1\ngpu-node-7\n", true, &hosts, &error), 0);

  EXPECT_EQ(parse_hostfile("10.0.0.1 slots=0\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(error.line, 1);
  EXPECT_EQ(parse_hostfile("10.0.0.1 cpus=4\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(parse_hostfile("# nothing\n\n", false, &hosts, &error), -EINVAL);
  EXPECT_EQ(error.message, "no hosts");
}

TEST(Nodelist, ExpandsSlurmRanges) {
  std::vector<std::string> names;
  LineError error;
  ASSERT_EQ(expand_nodelist("node[01-03,07],login,rack[1-2]-gpu[8-9]", &names, &error), 0)
      << error.message;
  std::vector<std::string> expected = {"node01",     "node02",     "node03",
                                       "node07",     "login",      "rack1-gpu8",
                                       "rack1-gpu9", "rack2-gpu8", "rack2-gpu9"};
  EXPECT_EQ(names, expected);
  ASSERT_EQ(expand_nodelist("n[8-10]", &names, &error), 0);
  EXPECT_EQ(names, (std::vector<std::string>{"n8", "n9", "n10"}));
}

TEST(Nodelist, RejectsMalformedLists) {
  std::vector<std::string> names;
  LineError error;
  EXPECT_EQ(expand_nodelist("node[01-03", &names, &error), -EINVAL);
  EXPECT_EQ(expand_nodelist("node[3-1]", &names, &error), -EINVAL);
  EXPECT_EQ(expand_nodelist("node[]", &names, &error), -EINVAL);
  EXPECT_EQ(expand_nodelist("node]", &names, &error), -EINVAL);
  EXPECT_EQ(expand_nodelist("", &names, &error), -EINVAL);
  EXPECT_EQ(expand_nodelist("a b", &names, &error), -EINVAL);
}

// A hostile list once recursed per bracket group (a crash at 20,000 groups)
// and copied the name at each level (quadratic memory).
TEST(Nodelist, ManyBracketGroupsAreBoundedNotRecursed) {
  std::vector<std::string> names;
  LineError error;
  ASSERT_EQ(expand_nodelist("n[1][2][3]-[08-09]", &names, &error), 0) << error.message;
  EXPECT_EQ(names, (std::vector<std::string>{"n123-08", "n123-09"}));
  std::string deep = "10.0.0.1";
  for (int i = 0; i < 20000; ++i) deep += "[1]";
  EXPECT_EQ(expand_nodelist(deep, &names, &error), -EINVAL);
  EXPECT_NE(error.message.find("longer than 255 characters"), std::string::npos) << error.message;
  EXPECT_LT(error.message.size(), 200u);  // the message quotes the start, not 60 KB
  EXPECT_EQ(expand_nodelist("a[0-9][0-9][0-9][0-9][0-9]", &names, &error), -EINVAL);
  EXPECT_NE(error.message.find("more than 65536 names"), std::string::npos) << error.message;
  EXPECT_EQ(expand_nodelist(std::string(300, 'a'), &names, &error), -EINVAL);
}

TEST(Rank, FoundExactlyOnce) {
  std::vector<HostEntry> hosts;
  LineError error;
  ASSERT_EQ(parse_hostfile("10.0.0.1\n10.0.0.2\n10.0.0.3\n", false, &hosts, &error), 0);
  int rank = -1;
  ASSERT_EQ(find_own_rank(hosts, {"127.0.0.1", "10.0.0.2"}, &rank, &error), 0);
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(find_own_rank(hosts, {"10.9.9.9"}, &rank, &error), -ENOENT);
  EXPECT_EQ(find_own_rank(hosts, {"10.0.0.1", "10.0.0.3"}, &rank, &error), -EEXIST);
  EXPECT_EQ(error.line, 3);
  EXPECT_NE(error.message.find("1, 3"), std::string::npos);
}

}  // namespace
}  // namespace pod_init
