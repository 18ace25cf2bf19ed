#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/tests/temp_folder_test.hpp"
#include "init/init_config.hpp"
#include "init/nvidia_bringup.hpp"
#include "init/nvml_state.hpp"

namespace pod_init {
namespace {

TEST(InitConfig, GpuBringupParameters) {
  InitConfig config;
  std::vector<std::string> errors;
  apply_init_params(split_cmdline("podinit.nvreg=NVreg_EnableGpuFirmware=0,NVreg_X=a+b "
                                  "podinit.modules_lock=off podinit.gpu_wait=300 "
                                  "podinit.sysfs=/fixture/sys"),
                    "cmdline", &config, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(config.nvreg, "NVreg_EnableGpuFirmware=0 NVreg_X=a+b");
  EXPECT_FALSE(config.modules_lock);
  EXPECT_EQ(config.gpu_wait_s, 300u);
  EXPECT_EQ(config.sysfs_root, "/fixture/sys");
  apply_init_params(split_cmdline("podinit.nvreg=NVreg_A podinit.nvreg=a-b=1 "
                                  "podinit.modules_lock=maybe podinit.gpu_wait=0 podinit.sysfs=x"),
                    "cmdline", &config, &errors);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_EQ(errors[0],
            "cmdline: podinit.nvreg= takes NAME=VALUE items separated by commas, not 'NVreg_A'");
  EXPECT_NE(errors[1].find("not 'a-b=1'"), std::string::npos);
  EXPECT_NE(errors[2].find("podinit.modules_lock= must be on or off"), std::string::npos);
  EXPECT_NE(errors[3].find("podinit.gpu_wait= needs a whole number of seconds"), std::string::npos);
  EXPECT_NE(errors[4].find("podinit.sysfs= needs an absolute path"), std::string::npos);
  EXPECT_EQ(config.nvreg, "NVreg_EnableGpuFirmware=0 NVreg_X=a+b");  // bad values change nothing
}

TEST(NvmlState, LinesRoundTripAndOthersAreRefused) {
  GpuNvmlState state;
  state.bdf = "0000:18:00.0";
  state.persistence = 1;
  state.fabric = FabricState::InProgress;
  state.fabric_status = 0;
  state.details.sm = 90;
  state.details.nvlinks = {{kNvSwitchTarget, NvLinkPeer::Switch, 18}};
  std::string line = format_gpu_state(state);
  EXPECT_EQ(line,
            "gpu 0000:18:00.0 persistence=on fabric=in-progress fabric_status=0 sm=90 "
            "nvlinks=fffffff:ff:ff.0*18");
  GpuNvmlState back;
  ASSERT_TRUE(parse_gpu_state(line, &back));
  EXPECT_EQ(back.bdf, state.bdf);
  EXPECT_EQ(back.persistence, 1);
  EXPECT_EQ(back.fabric, FabricState::InProgress);
  EXPECT_FALSE(fabric_ready(back));
  ASSERT_EQ(back.details.nvlinks.size(), 1u);
  EXPECT_EQ(back.details.nvlinks[0].peer, NvLinkPeer::Switch);
  EXPECT_EQ(back.details.nvlinks[0].count, 18);
  GpuNvmlState pair;
  ASSERT_TRUE(
      parse_gpu_state("gpu 0000:00:06.0 persistence=off fabric=not-supported fabric_status=0 sm=90 "
                      "nvlinks=0000:00:07.0*18",
                      &pair));
  EXPECT_TRUE(fabric_ready(pair));
  EXPECT_EQ(pair.details.nvlinks[0].peer, NvLinkPeer::Gpu);
  for (const char* bad : {"pod-init-nvml: cannot load NVML", "gpu 18:00 persistence=on",
                          "gpu 0000:18:00.0 persistence=yes fabric=completed fabric_status=0 "
                          "sm=90 nvlinks=",
                          "gpu 0000:18:00.0 persistence=on fabric=completed fabric_status=0 "
                          "sm=90 nvlinks=nowhere*3"}) {
    EXPECT_FALSE(parse_gpu_state(bad, &back)) << bad;
  }
}

// A node's files as the driver leaves them, in a temporary folder.
class FakeNode : public TempFolderTest {
 protected:
  FakeNode() : TempFolderTest("/var/tmp/bringup-XXXXXX") {}
  void SetUp() override {
    TempFolderTest::SetUp();
    if (HasFatalFailure()) return;
    write("release/modules.dep",
          "updates/nvidia.ko:\nupdates/nvidia-modeset.ko: updates/nvidia.ko\n"
          "updates/nvidia-uvm.ko: updates/nvidia.ko\n");
    write("sys_module/nvidia/refcnt", "0\n");
    write("sys_module/nvidia_modeset/refcnt", "0\n");
    write("proc/devices", "Character devices:\n195 nvidia-frontend\n508 nvidia-uvm\n");
    write("proc/driver/nvidia/gpus/0000:03:00.0/information", "Model: H100\n");
    mkdir((root_ + "/dev").c_str(), 0755);
    options_.release_dir = root_ + "/release";
    options_.sys_module_dir = root_ + "/sys_module";
    options_.proc_dir = root_ + "/proc";
    options_.dev_dir = root_ + "/dev";
    options_.helper = root_ + "/helper";
    options_.dry_run = true;
    options_.private_mounts = false;
    options_.deadline_s = 1;
    options_.log = [this](const std::string& line) { log_ += line + "\n"; };
  }

  void write(const std::string& path, const std::string& text) {
    std::string full = root_ + "/" + path;
    std::system(("mkdir -p '" + full.substr(0, full.rfind('/')) + "'").c_str());
    std::ofstream(full) << text;
  }
  // The NVML reader, as a script that records its arguments and prints `output`.
  void helper(const std::string& output, int status) {
    write("helper", "#!/bin/sh\necho \"$@\" > " + root_ + "/helper.args\nprintf '" + output +
                        "'\nexit " + std::to_string(status) + "\n");
    chmod((root_ + "/helper").c_str(), 0755);
  }
  std::string read(const std::string& path) {
    std::ifstream in(root_ + "/" + path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string log_;
  NvidiaBringupOptions options_;
};

TEST_F(FakeNode, ADryRunReadsEveryStepAndChangesNothing) {
  write("proc/driver/nvidia/gpus/0000:04:00.0/information", "Model: H100\n");
  helper(
      "gpu 0000:03:00.0 persistence=on fabric=completed fabric_status=0 sm=90 "
      "nvlinks=fffffff:ff:ff.0*18\\ngpu 0000:04:00.0 persistence=off fabric=completed "
      "fabric_status=0 sm=90 nvlinks=fffffff:ff:ff.0*18\\nwaited_ms 7\\n",
      0);
  NvidiaBringup bringup(options_);
  bringup.start({{"0000:03:00.0", "0000:04:00.0"}, {"0000:e1:00.0"}});
  GpuDetailsMap details = bringup.finish();
  ASSERT_EQ(details.size(), 2u);
  EXPECT_EQ(details["0000:04:00.0"].nvlinks[0].count, 18);
  EXPECT_EQ(details["0000:04:00.0"].sm, 90);
  // Read only: no persistence asked of NVML, the fabric waited for, nothing made.
  EXPECT_EQ(read("helper.args"), "--wait-fabric 1 0000:03:00.0 0000:04:00.0\n");
  EXPECT_NE(log_.find("module nvidia already loaded"), std::string::npos) << log_;
  EXPECT_NE(log_.find("module nvidia_uvm not loaded (dry run)"), std::string::npos) << log_;
  EXPECT_NE(log_.find("0 of 5 device nodes present (dry run: none made)"), std::string::npos);
  EXPECT_NE(log_.find("fabric: complete on 2 GPUs after 7 ms"), std::string::npos) << log_;
  EXPECT_NE(log_.find("persistence: off on 0000:04:00.0 (dry run: left as it is)"),
            std::string::npos);
  EXPECT_EQ(access((root_ + "/dev/nvidiactl").c_str(), F_OK), -1);
  std::vector<std::string> names;
  for (const BootPhase& phase : bringup.phases()) names.push_back(phase.phase);
  EXPECT_EQ(names,
            (std::vector<std::string>{"nvidia modules", "gpu wait", "persistence", "fabric"}));
  EXPECT_EQ(bringup.lock_modules().phase, "modules lock");
  EXPECT_NE(log_.find("modules: loading not locked (dry run)"), std::string::npos);
}

TEST_F(FakeNode, AKernelWithTheDriverAndNoModuleFilesIsSeenAsItIs) {
  std::system(("rm -rf '" + root_ + "/release'").c_str());
  helper("gpu 0000:03:00.0 persistence=on fabric=not-supported fabric_status=0 sm=90 nvlinks=\\n",
         0);
  NvidiaBringup bringup(options_);
  bringup.start({{"0000:03:00.0"}, {}});
  EXPECT_EQ(bringup.finish().size(), 1u);
  EXPECT_NE(
      log_.find("nvidia: module nvidia already loaded (no " + root_ + "/release/modules.dep)"),
      std::string::npos)
      << log_;
  std::system(("rm -rf '" + root_ + "/sys_module/nvidia'").c_str());
  NvidiaBringup without(options_);
  EXPECT_THROW(without.start({{"0000:03:00.0"}, {}}), SysError);
}

TEST_F(FakeNode, AGpuTheDriverNeverBindsIsNamedAtTheDeadline) {
  helper("", 0);
  NvidiaBringup bringup(options_);
  try {
    bringup.start({{"0000:03:00.0", "0000:04:00.0"}, {}});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "nvidia: 1 of 2 GPUs not bound by the driver after 1 s: 0000:04:00.0 (no " + root_ +
                  "/proc/driver/nvidia/gpus/BDF; the kernel log says why)");
  }
}

TEST_F(FakeNode, AnIncompleteFabricNamesEachGpuAndItsState) {
  helper(
      "gpu 0000:03:00.0 persistence=on fabric=in-progress fabric_status=0 sm=90 nvlinks=\\n"
      "waited_ms 1000\\n",
      3);
  NvidiaBringup bringup(options_);
  bringup.start({{"0000:03:00.0"}, {"0000:e1:00.0"}});
  try {
    bringup.finish();
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "fabric: not complete after 1 s: 0000:03:00.0 in-progress (the fabric manager's "
              "log: /var/log/fabricmanager.log)");
  }
}

TEST_F(FakeNode, WithoutNvSwitchesAnNvmlFailureIsALineNotAStop) {
  helper("pod-init-nvml: cannot load NVML: libnvidia-ml.so.1: no such file\\n", 1);
  NvidiaBringup bringup(options_);
  bringup.start({{"0000:03:00.0"}, {}});
  EXPECT_TRUE(bringup.finish().empty());
  EXPECT_EQ(read("helper.args"), "0000:03:00.0\n");
  EXPECT_NE(log_.find("nvidia: pod-init-nvml: cannot load NVML: libnvidia-ml.so.1: no such "
                      "file (persistence and NVLinks unread)"),
            std::string::npos)
      << log_;
}

TEST(NvidiaHardware, GpusAndNvSwitchesFromTheScan) {
  Topology topo;
  PciDevice gpu;
  gpu.bdf = "0000:03:00.0";
  gpu.vendor = 0x10de;
  gpu.class_code = 0x030200;
  gpu.kind = DeviceKind::Gpu;
  PciDevice nvswitch = gpu;
  nvswitch.bdf = "0000:e1:00.0";
  nvswitch.class_code = 0x068000;
  nvswitch.kind = DeviceKind::Other;
  PciDevice bridge = nvswitch;
  bridge.bdf = "0000:e0:01.0";
  bridge.vendor = 0x8086;
  topo.devices = {gpu, nvswitch, bridge};
  NvidiaHardware found = find_nvidia_hardware(topo);
  EXPECT_EQ(found.gpus, (std::vector<std::string>{"0000:03:00.0"}));
  EXPECT_EQ(found.nvswitches, (std::vector<std::string>{"0000:e1:00.0"}));
}

}  // namespace
}  // namespace pod_init
