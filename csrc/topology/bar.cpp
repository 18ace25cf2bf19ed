#include "topology/bar.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "common/sysfs.hpp"

namespace pod_init {

namespace {

constexpr uint64_t kResourceIo = 0x100;
constexpr uint64_t kResourceMem = 0x200;
constexpr uint64_t kResourcePrefetch = 0x2000;
constexpr uint64_t kResourceMem64 = 0x100000;
constexpr int kStandardBars = 6;

struct ChipName {
  uint32_t id;
  const char* chip;
};
constexpr ChipName kChips[] = {
    {0x130, "GP100"}, {0x132, "GP102"}, {0x134, "GP104"}, {0x140, "GV100"}, {0x162, "TU102"},
    {0x164, "TU104"}, {0x166, "TU106"}, {0x167, "TU117"}, {0x168, "TU116"}, {0x170, "GA100"},
    {0x172, "GA102"}, {0x173, "GA103"}, {0x174, "GA104"}, {0x176, "GA106"}, {0x177, "GA107"},
    {0x180, "GH100"}, {0x192, "AD102"}, {0x193, "AD103"}, {0x194, "AD104"}, {0x196, "AD106"},
    {0x197, "AD107"}, {0x1a0, "GB100"}, {0x1a2, "GB102"}, {0x1b2, "GB202"}, {0x1b3, "GB203"},
    {0x1b5, "GB205"}, {0x1b6, "GB206"}, {0x1b7, "GB207"},
};

struct ArchName {
  uint32_t family;
  const char* name;
};
constexpr ArchName kArchitectures[] = {
    {0x13, "Pascal"}, {0x14, "Volta"}, {0x16, "Turing"},    {0x17, "Ampere"},
    {0x18, "Hopper"}, {0x19, "Ada"},   {0x1a, "Blackwell"}, {0x1b, "Blackwell"},
};

}  // namespace

int parse_resource(const std::string& text, std::vector<Bar>* bars) {
  bars->clear();
  std::istringstream lines(text);
  std::string line;
  for (int index = 0; index < kStandardBars && std::getline(lines, line); ++index) {
    std::istringstream fields(line);
    std::string start_text, end_text, flags_text;
    if (!(fields >> start_text >> end_text >> flags_text)) return -EINVAL;
    auto start = sysfs::parse_hex(start_text);
    auto end = sysfs::parse_hex(end_text);
    auto flags = sysfs::parse_hex(flags_text);
    if (!start || !end || !flags) return -EINVAL;
    if (*start == 0 && *end == 0) continue;
    if (*end < *start) return -EINVAL;
    Bar bar;
    bar.index = index;
    bar.start = *start;
    bar.size = *end - *start + 1;
    bar.is_io = (*flags & kResourceIo) != 0;
    bar.is_64bit = (*flags & kResourceMem64) != 0;
    bar.prefetchable = (*flags & kResourcePrefetch) != 0;
    bars->push_back(bar);
  }
  return 0;
}

const Bar* nvidia_bar1(const std::vector<Bar>& bars) {
  int memory_bars = 0;
  for (const Bar& bar : bars) {
    if (bar.is_io) continue;
    if (memory_bars++ == 1) return &bar;
  }
  return nullptr;
}

std::string format_bar_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g %s", value, kUnits[unit]);
  return buf;
}

const char* bar0_state_name(Bar0State state) {
  switch (state) {
    case Bar0State::Mapped:
      return "mapped";
    case Bar0State::Denied:
      return "denied";
    case Bar0State::Unavailable:
      return "unavailable";
    case Bar0State::Failed:
      return "failed";
  }
  return "failed";
}

ChipId decode_boot0(uint32_t boot0) {
  ChipId id;
  uint32_t chip = (boot0 >> 20) & 0x1ff;
  for (const ChipName& known : kChips) {
    if (known.id == chip) id.chip = known.chip;
  }
  for (const ArchName& arch : kArchitectures) {
    if (arch.family == (chip >> 4)) id.architecture = arch.name;
  }
  return id;
}

Bar0Probe probe_bar0(const std::string& resource_path) {
  Bar0Probe probe;
  auto fail = [&probe](int err) {
    probe.err = err;
    probe.state = (err == EPERM || err == EACCES) ? Bar0State::Denied
                  : err == ENOENT                 ? Bar0State::Unavailable
                                                  : Bar0State::Failed;
    return probe;
  };
  int fd = ::open(resource_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(errno);
  struct stat st {};
  if (::fstat(fd, &st) < 0) {
    int err = errno;
    ::close(fd);
    return fail(err);
  }
  // sysfs gives resource files the BAR's size; touching a page past the end
  // of a shorter file would raise SIGBUS instead of an error.
  if (S_ISREG(st.st_mode) && st.st_size < 4) {
    ::close(fd);
    return fail(ENXIO);
  }
  long page = ::sysconf(_SC_PAGESIZE);
  void* map = ::mmap(nullptr, static_cast<size_t>(page), PROT_READ, MAP_SHARED, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) return fail(map_err);
  probe.boot0 = *static_cast<const volatile uint32_t*>(map);
  ::munmap(map, static_cast<size_t>(page));
  probe.state = Bar0State::Mapped;
  ChipId id = decode_boot0(probe.boot0);
  probe.chip = id.chip;
  probe.architecture = id.architecture;
  return probe;
}

}  // namespace pod_init
