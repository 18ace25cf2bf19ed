#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/sha256.hpp"
#include "common/sysfs.hpp"
#include "init/init_config.hpp"
#include "init/kernel_modules.hpp"
#include "init/supervisor.hpp"

namespace pod_init {
namespace {

TEST(InitConfig, KernelCommandLine) {
  InitConfig config;
  std::vector<std::string> errors;
  std::string cmdline =
      "BOOT_IMAGE=/vmlinuz console=ttyS0 podinit.modules=nvme,ext4 podinit.hostname=node-3 "
      "podinit.cmd=\"/usr/bin/python -m train\" podinit.grace=5 podinit.end=reboot "
      "podinit.expect_gpus=8 podinit.wait=/dev/nvme0n1,/dev/nvme1n1 quiet";
  apply_init_params(split_cmdline(cmdline), "cmdline", &config, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(config.command, (std::vector<std::string>{"/usr/bin/python", "-m", "train"}));
  EXPECT_EQ(config.modules, (std::vector<std::string>{"nvme", "ext4"}));
  EXPECT_EQ(config.hostname, "node-3");
  EXPECT_EQ(config.grace_s, 5u);
  EXPECT_EQ(config.end, EndAction::Reboot);
  EXPECT_EQ(config.expect_gpus, 8);
  EXPECT_EQ(config.wait, (std::vector<std::string>{"/dev/nvme0n1", "/dev/nvme1n1"}));

  InitConfig dashed;
  apply_init_params(split_cmdline("ro podinit.cmd=/bin/false -- /bin/echo \"a b\" c"), "cmdline",
                    &dashed, &errors);
  EXPECT_EQ(dashed.command, (std::vector<std::string>{"/bin/echo", "a b", "c"}));
}

TEST(InitConfig, BadParametersAreNamed) {
  InitConfig config;
  std::vector<std::string> errors;
  apply_init_params(split_cmdline("podinit.end=explode podinit.grace=-1 podinit.colour=red "
                                  "podinit.cmd= podinit.data"),
                    "kernel command line", &config, &errors);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_EQ(errors[0],
            "kernel command line: podinit.end= must be poweroff, reboot or halt, not 'explode'");
  EXPECT_NE(errors[1].find("podinit.grace= needs a whole number"), std::string::npos);
  EXPECT_NE(errors[2].find("unknown parameter podinit.colour"), std::string::npos);
  EXPECT_NE(errors[3].find("podinit.cmd= is empty"), std::string::npos);
  EXPECT_NE(errors[4].find("without a value: 'podinit.data'"), std::string::npos);
  EXPECT_EQ(config.end, EndAction::Poweroff);  // bad values change nothing
}

TEST(InitConfig, WarmInterpreter) {
  InitConfig config;
  std::vector<std::string> errors;
  apply_init_params(split_cmdline("podinit.warm=on"), "cmdline", &config, &errors);
  EXPECT_TRUE(config.warm);
  EXPECT_EQ(config.warm_preloads, "");
  apply_init_params(split_cmdline("podinit.warm=transformers,my.models"), "cmdline", &config,
                    &errors);
  EXPECT_TRUE(config.warm);
  EXPECT_EQ(config.warm_preloads, "transformers,my.models");
  apply_init_params(split_cmdline("podinit.warm=off podinit.warm=$(reboot)"), "cmdline", &config,
                    &errors);
  EXPECT_FALSE(config.warm);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(
      errors[0],
      "cmdline: podinit.warm= must be on, off or modules to preload (a,b.c), not '$(reboot)'");
}

TEST(InitConfig, FileThenCommandLine) {
  InitConfig config;
  std::vector<std::string> errors;
  apply_init_file(
      "# defaults baked into the image\npodinit.cmd=/bin/train --fast\n\n"
      "podinit.grace=30\nnot a setting\n",
      "/etc/pod-init.conf", &config, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].rfind("/etc/pod-init.conf:5: expected podinit.KEY=VALUE", 0), 0u);
  apply_init_params(split_cmdline("podinit.grace=2"), "cmdline", &config, &errors);
  EXPECT_EQ(config.grace_s, 2u);
  EXPECT_EQ(config.command, (std::vector<std::string>{"/bin/train", "--fast"}));
}

// Lines were cut at the first '#', so a command holding one lost its tail.
TEST(InitConfig, AHashInsideAValueIsKept) {
  InitConfig config;
  std::vector<std::string> errors;
  apply_init_file("  # a comment\npodinit.cmd=/bin/train --tag=#3 --fast\n", "/etc/pod-init.conf",
                  &config, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(config.command, (std::vector<std::string>{"/bin/train", "--tag=#3", "--fast"}));
}

constexpr const char* kModulesDep =
    "kernel/drivers/nvme/host/nvme-core.ko: kernel/block/t10-pi.ko kernel/lib/crc64-rocksoft.ko\n"
    "kernel/drivers/nvme/host/nvme.ko: kernel/drivers/nvme/host/nvme-core.ko kernel/block/t10-pi.ko"
    " kernel/lib/crc64-rocksoft.ko\n"
    "kernel/block/t10-pi.ko: kernel/lib/crc64-rocksoft.ko\n"
    "kernel/lib/crc64-rocksoft.ko.xz:\n"
    "kernel/a.ko: kernel/b.ko\n"
    "kernel/b.ko: kernel/a.ko\n";

TEST(KernelModules, DependenciesFirstEachOnce) {
  ModuleIndex index;
  LineError error;
  ASSERT_EQ(parse_modules_dep(kModulesDep, &index, &error), 0);
  parse_modules_builtin("kernel/crypto/crc32c_generic.ko\n", &index);
  EXPECT_EQ(index.path.at("crc64_rocksoft"), "kernel/lib/crc64-rocksoft.ko.xz");
  std::vector<std::string> order;
  std::string missing;
  ASSERT_EQ(module_load_order(index, {"nvme", "crc32c-generic", "t10_pi"}, &order, &missing), 0);
  EXPECT_EQ(order, (std::vector<std::string>{"crc64_rocksoft", "t10_pi", "nvme_core", "nvme"}));
  order.clear();
  EXPECT_EQ(module_load_order(index, {"nvme", "nvidia"}, &order, &missing), -ENOENT);
  EXPECT_EQ(missing, "nvidia");
  EXPECT_EQ(module_load_order(index, {"a"}, &order, &missing), -ELOOP);
  EXPECT_EQ(parse_modules_dep("no colon here\n", &index, &error), -EINVAL);
  EXPECT_EQ(error.line, 1);
}

TEST(KernelModules, NvidiaNodesFromProcDevices) {
  const char* devices =
      "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n508 nvidia-uvm\n\n"
      "Block devices:\n259 blkext\n";
  std::vector<DeviceNode> nodes = nvidia_device_nodes(devices, 2, "/x");
  ASSERT_EQ(nodes.size(), 5u);
  EXPECT_EQ(nodes[0].path, "/x/nvidiactl");
  EXPECT_EQ(nodes[0].minor, 255u);
  EXPECT_EQ(nodes[2].path, "/x/nvidia1");
  EXPECT_EQ(nodes[2].major, 195u);
  EXPECT_EQ(nodes[3].path, "/x/nvidia-uvm");
  EXPECT_EQ(nodes[3].major, 508u);
  EXPECT_TRUE(nvidia_device_nodes("Character devices:\n  1 mem\n", 8).empty());
}

TEST(KernelModules, MakesCharacterDevices) {
  if (geteuid() != 0) GTEST_SKIP() << "mknod needs root";
  char dir[] = "/var/tmp/nodes-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::vector<DeviceNode> nodes = {{std::string(dir) + "/nvidiactl", 195, 255}};
  ASSERT_EQ(make_device_nodes(nodes), 0);
  ASSERT_EQ(make_device_nodes(nodes), 0);  // existing nodes are fine
  struct stat st {};
  ASSERT_EQ(stat(nodes[0].path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  EXPECT_EQ(major(st.st_rdev), 195u);
  EXPECT_EQ(minor(st.st_rdev), 255u);
  unlink(nodes[0].path.c_str());
  rmdir(dir);
}

std::string sha256_of(const std::string& text) {
  Sha256 sha;
  sha.update(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return sha.hex_digest();
}

TEST(Sha256, KnownAnswers) {
  // FIPS 180-4 examples.
  EXPECT_EQ(sha256_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  EXPECT_EQ(sha256_of(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Fed in odd pieces, the same digest.
  Sha256 pieces;
  for (size_t at = 0; at < million.size(); at += 77) {
    size_t n = std::min<size_t>(77, million.size() - at);
    pieces.update(reinterpret_cast<const uint8_t*>(million.data()) + at, n);
  }
  EXPECT_EQ(pieces.hex_digest(), sha256_of(million));
}

std::string command_line_shown() {
  std::string text;
  EXPECT_EQ(sysfs::read_text("/proc/self/cmdline", &text, 1 << 20), 0);
  return text;  // read_text drops trailing whitespace, not the NULs
}

// What the kernel shows once `arguments` follow `name` in a line of `room` bytes.
std::string expected_shown(const std::string& name, const std::vector<std::string>& arguments,
                           size_t room) {
  std::string line = name + '\0';
  for (const std::string& argument : arguments) line.append(argument).push_back('\0');
  line.resize(room, '\0');
  line.back() = '\0';
  return line;
}

TEST(Supervisor, ArgumentsShownFollowTheNameAndStopWhereTheLineEnds) {
  std::string before = command_line_shown();
  std::string name = before.substr(0, before.find('\0'));
  std::vector<std::string> script = {"train.py", "--steps", "5"};
  int shown = set_arguments_shown(script);
  ASSERT_GT(shown, 0);
  EXPECT_EQ(command_line_shown(), expected_shown(name, script, before.size()));
  size_t wanted = name.size() + 1 + sizeof("train.py") + sizeof("--steps") + sizeof("5");
  EXPECT_EQ(static_cast<size_t>(shown), std::min(before.size(), wanted));
  // Longer than the line: cut where it ends, the last argument still ended.
  std::vector<std::string> long_one = {std::string(before.size() * 2, 'x')};
  EXPECT_EQ(set_arguments_shown(long_one), static_cast<int>(before.size()));
  EXPECT_EQ(command_line_shown(), expected_shown(name, long_one, before.size()));
  // Shorter again: nothing of the longer one is left behind.
  EXPECT_EQ(set_arguments_shown({}), static_cast<int>(name.size() + 1));
  EXPECT_EQ(command_line_shown(), expected_shown(name, {}, before.size()));
}

TEST(Supervisor, IoPriorityIsSetAndReadBack) {
  int before = io_priority();
  ASSERT_GE(before, 0);
  constexpr int kIdle = 3 << 13;  // IOPRIO_CLASS_IDLE: any process may take it
  ASSERT_EQ(set_io_priority(kIdle), 0);
  EXPECT_EQ(io_priority(), kIdle);
  EXPECT_EQ(io_priority(getpid()), kIdle);       // the same process, named
  EXPECT_EQ(set_io_priority(7 << 13), -EINVAL);  // no such class
  // A child is asked by its pid: it inherited the priority at its fork.
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(io_priority(child), kIdle);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(io_priority(child), -ESRCH);  // reaped: no such process
  // Back as it was (the test process's later tests read files).
  EXPECT_EQ(set_io_priority(before), 0);
}

}  // namespace
}  // namespace pod_init
