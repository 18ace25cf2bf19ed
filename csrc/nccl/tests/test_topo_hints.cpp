#include <gtest/gtest.h>

#include "nccl/detail/topo_hints.hpp"

namespace pod_init {
namespace {

PciDevice device(const std::string& bdf, DeviceKind kind) {
  PciDevice dev;
  dev.bdf = bdf;
  dev.kind = kind;
  dev.root_bus = "pci0000:00";
  dev.link.max_speed_gts = 32.0;
  dev.link.width = 16;
  return dev;
}

// A flattened VM: everything on one root bus, NUMA unknown.
Topology flat_vm() {
  Topology topo;
  topo.devices = {device("0000:00:03.0", DeviceKind::Nic),
                  device("0000:00:04.0", DeviceKind::Other),
                  device("0000:00:06.0", DeviceKind::Gpu), device("0000:00:07.0", DeviceKind::Gpu),
                  device("0000:00:08.0", DeviceKind::Gpu)};
  topo.matrix = build_matrix(topo.devices);
  return topo;
}

TEST(TopoHints, RegroupsAFlatTree) {
  TopoHints hints;
  LineError error;
  const char* text =
      "# two GPUs and the NIC share a switch on NUMA node 1\n"
      "numa 1 0000:00:06.0 0000:00:07.0 0000:00:03.0\n"
      "switch 0000:00:06.0 0000:00:07.0 0000:00:03.0   # trailing comment\n";
  ASSERT_EQ(parse_topo_hints(text, &hints, &error), 0) << error.message;
  Topology topo = flat_vm();
  ASSERT_EQ(check_topo_hints(hints, topo.devices, &error), 0) << error.message;
  ASSERT_EQ(topo.matrix.rows[0][1], Level::Phb);  // GPU0-GPU1 before
  apply_topo_hints(hints, &topo);

  ASSERT_EQ(hints.switches.size(), 1u);
  EXPECT_EQ(hints.switches[0].busid, "ffff:ff:01.0");
  // Matrix: GPU0 GPU1 GPU2 NIC0. Members of the switch are PIX, the rest PHB.
  EXPECT_EQ(topo.matrix.rows[0][1], Level::Pix);
  EXPECT_EQ(topo.matrix.rows[0][3], Level::Pix);
  EXPECT_EQ(topo.matrix.rows[0][2], Level::Phb);
  const PciDevice& bridge = topo.devices.back();
  EXPECT_EQ(bridge.bdf, "ffff:ff:01.0");
  EXPECT_EQ(bridge.numa_node, 1);
  EXPECT_EQ(bridge.kind, DeviceKind::Bridge);
  EXPECT_EQ(topo.devices[2].numa_node, 1);
  EXPECT_EQ(topo.devices[4].numa_node, -1);
}

TEST(TopoHints, SyntaxErrorsNameTheLine) {
  TopoHints hints;
  LineError error;
  EXPECT_EQ(parse_topo_hints("numa 0 0000:00:06.0\nrack 1\n", &hints, &error), -EINVAL);
  EXPECT_EQ(error.line, 2);
  EXPECT_NE(error.message.find("unknown keyword 'rack'"), std::string::npos);

  EXPECT_EQ(parse_topo_hints("numa x 0000:00:06.0\n", &hints, &error), -EINVAL);
  EXPECT_EQ(error.line, 1);
  EXPECT_EQ(parse_topo_hints("numa 0\n", &hints, &error), -EINVAL);
  EXPECT_EQ(parse_topo_hints("switch 00:06.0\n", &hints, &error), -EINVAL);
  EXPECT_NE(error.message.find("not a PCI address"), std::string::npos);

  EXPECT_EQ(parse_topo_hints("switch 0000:00:06.0\n\nswitch 0000:00:06.0\n", &hints, &error),
            -EINVAL);
  EXPECT_EQ(error.line, 3);
  EXPECT_NE(error.message.find("already in a switch on line 1"), std::string::npos);
}

TEST(TopoHints, DevicesMustExistAndAgree) {
  Topology topo = flat_vm();
  TopoHints hints;
  LineError error;
  ASSERT_EQ(parse_topo_hints("\nnuma 0 0000:00:09.0\n", &hints, &error), 0);
  EXPECT_EQ(check_topo_hints(hints, topo.devices, &error), -EINVAL);
  EXPECT_EQ(error.line, 2);
  EXPECT_EQ(error.message, "0000:00:09.0: no such PCI device");

  ASSERT_EQ(parse_topo_hints("switch 0000:00:04.0\n", &hints, &error), 0);
  EXPECT_EQ(check_topo_hints(hints, topo.devices, &error), -EINVAL);
  EXPECT_NE(error.message.find("not a GPU or NIC"), std::string::npos);

  ASSERT_EQ(parse_topo_hints("numa 0 0000:00:06.0\nnuma 1 0000:00:07.0\n"
                             "switch 0000:00:06.0 0000:00:07.0\n",
                             &hints, &error),
            0);
  EXPECT_EQ(check_topo_hints(hints, topo.devices, &error), -EINVAL);
  EXPECT_EQ(error.line, 3);
}

}  // namespace
}  // namespace pod_init
