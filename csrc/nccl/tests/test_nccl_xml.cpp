#include <gtest/gtest.h>

#include "nccl/detail/nccl_xml.hpp"

namespace pod_init {
namespace {

TEST(NcclXml, CpulistToKernelMask) {
  EXPECT_EQ(cpulist_to_mask("0-3,8"), "0000010f");
  EXPECT_EQ(cpulist_to_mask("0-31"), "ffffffff");
  EXPECT_EQ(cpulist_to_mask("32\n"), "00000001,00000000");
  EXPECT_EQ(cpulist_to_mask("0-55,112-167"),
            "000000ff,ffffffff,ffff0000,00000000,00ffffff,ffffffff");
  EXPECT_EQ(cpulist_to_mask(""), "");
  EXPECT_EQ(cpulist_to_mask("3-1"), "");
}

TEST(NcclXml, CpuIdentityFromCpuinfo) {
  CpuIdentity x86 = parse_cpuinfo(
      "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
      "model name\t: Intel(R) Xeon(R) Processor\n\nprocessor\t: 1\nvendor_id\t: Other\n");
  EXPECT_EQ(x86.arch, "x86_64");
  EXPECT_EQ(x86.vendor, "GenuineIntel");
  EXPECT_EQ(x86.family, 6);
  EXPECT_EQ(x86.model, 207);
  CpuIdentity arm = parse_cpuinfo("processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\n");
  EXPECT_EQ(arm.arch, "arm64");
  EXPECT_EQ(arm.vendor, "");
  EXPECT_EQ(parse_cpuinfo("").arch, "");
}

TEST(NcclXml, LinkSpeedInSysfsSpelling) {
  EXPECT_EQ(nccl_link_speed(32.0), "32.0 GT/s PCIe");
  EXPECT_EQ(nccl_link_speed(2.5), "2.5 GT/s PCIe");
}

TEST(NcclXml, GraphHoldsChannelsWithNetsAtBothEnds) {
  RingGraph graph;
  graph.channels = {{-1, {0, 1}}, {2, {1, 0}}};
  graph.speed_intra_gbs = 30;
  graph.speed_inter_gbs = 12.5;
  graph.type_intra = "NVL";
  graph.type_inter = "PXB";
  EXPECT_EQ(nccl_graph_xml(graph),
            "<graphs version=\"1\">\n"
            "  <graph id=\"0\" pattern=\"4\" crossnic=\"0\" nchannels=\"2\" speedintra=\"30\" "
            "speedinter=\"12.5\" latencyinter=\"0\" typeintra=\"NVL\" typeinter=\"PXB\" "
            "samechannels=\"0\">\n"
            "    <channel>\n"
            "      <gpu dev=\"0\"/>\n"
            "      <gpu dev=\"1\"/>\n"
            "    </channel>\n"
            "    <channel>\n"
            "      <net dev=\"2\"/>\n"
            "      <gpu dev=\"1\"/>\n"
            "      <gpu dev=\"0\"/>\n"
            "      <net dev=\"2\"/>\n"
            "    </channel>\n"
            "  </graph>\n"
            "</graphs>\n");
}

TEST(NcclXml, TopologyEscapesNamesAndSkipsUnnamedNics) {
  Topology topo;
  PciDevice nic;
  nic.bdf = "0000:00:03.0";
  nic.kind = DeviceKind::Nic;
  nic.class_code = 0x020000;
  nic.net_interfaces = {"e\"th<0>"};
  PciDevice unnamed = nic;
  unnamed.bdf = "0000:00:04.0";
  unnamed.net_interfaces.clear();
  topo.devices = {nic, unnamed};
  topo.matrix = build_matrix(topo.devices);
  std::string xml = nccl_topo_xml(topo, {}, {});
  EXPECT_NE(xml.find("<net name=\"e&quot;th&lt;0&gt;\"/>"), std::string::npos) << xml;
  EXPECT_EQ(xml.find("0000:00:04.0"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<cpu numaid=\"-1\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("link_speed=\"Unknown speed\" link_width=\"0\""), std::string::npos) << xml;
}

}  // namespace
}  // namespace pod_init
