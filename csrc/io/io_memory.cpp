#include "io/io_memory.hpp"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "io/aligned_buffer.hpp"

namespace pod_init {

namespace {

// How many retirements a ring can fall behind before it must check all of its
// registrations (a cheap walk over at most its table) instead of the list.
constexpr size_t kRetiredRemembered = 1024;

struct FreeBlock {
  uint8_t* data;
  uint64_t region;
};

struct PoolState {
  std::mutex mutex;
  uint64_t next_region = 1;
  std::map<uintptr_t, IoRegion> regions;  // by base address
  std::vector<FreeBlock> free[IoMemory::kClasses];
  std::deque<uint64_t> retired;  // the latest retired ids, oldest first
  IoMemoryStats stats;
};

PoolState* g_state = nullptr;
std::once_flag g_state_once;

PoolState& state() {
  std::call_once(g_state_once, [] {
    g_state = new PoolState();  // never freed: blocks may be released during exit
    // A fork while another thread holds the mutex would leave it held forever in the child.
    pthread_atfork([] { g_state->mutex.lock(); }, [] { g_state->mutex.unlock(); },
                   [] { g_state->mutex.unlock(); });
  });
  return *g_state;
}

int class_of(size_t size) {
  int size_class = 0;
  for (size_t bytes = IoMemory::kSmallest; bytes < size; bytes <<= 1) ++size_class;
  return size_class;
}

size_t class_bytes(int size_class) { return IoMemory::kSmallest << size_class; }

// At least 2 MiB, and at least four blocks: few regions for the small classes.
size_t arena_bytes(int size_class) {
  return std::max<size_t>(size_t{2} << 20, 4 * class_bytes(size_class));
}

// Huge pages where the kernel has them (THP "madvise" mode included): a 1 MiB
// read then spans a few physically contiguous segments instead of 256 pages,
// and a device that takes 128 segments per request (a loop device, say) gets
// it in one request rather than split in two; pinning and the TLB gain too.
uint8_t* map_memory(size_t bytes, bool populate) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  if (populate && madvise(p, bytes, MADV_POPULATE_WRITE) < 0) {
    // Before Linux 5.14: fault the pages in by hand.
    for (size_t at = 0; at < bytes; at += kPageSize) static_cast<volatile uint8_t*>(p)[at] = 0;
  }
  return static_cast<uint8_t*>(p);
}

IoRegion add_region(PoolState& s, uint8_t* base, size_t bytes, bool arena) {
  IoRegion region{s.next_region++, base, bytes, arena};
  s.regions[reinterpret_cast<uintptr_t>(base)] = region;
  return region;
}

}  // namespace

IoMemory& IoMemory::instance() {
  static IoMemory* memory = new IoMemory();
  state();
  return *memory;
}

IoBlock IoMemory::acquire(size_t size) {
  PoolState& s = state();
  size = size == 0 ? kSmallest : size;
  if (size <= kLargest) {
    int size_class = class_of(size);
    std::lock_guard<std::mutex> lock(s.mutex);
    std::vector<FreeBlock>& free = s.free[size_class];
    if (free.empty() && s.stats.arena_bytes + arena_bytes(size_class) <= kArenaLimit) {
      // Faulted in now, once, so no read ever waits for its pages.
      size_t bytes = arena_bytes(size_class);
      if (uint8_t* base = map_memory(bytes, true)) {
        IoRegion region = add_region(s, base, bytes, true);
        s.stats.arena_bytes += bytes;
        for (size_t at = bytes; at >= class_bytes(size_class); at -= class_bytes(size_class)) {
          free.push_back({base + at - class_bytes(size_class), region.id});
        }
      }
    }
    if (!free.empty()) {
      FreeBlock block = free.back();
      free.pop_back();
      ++s.stats.blocks_in_use;
      return {block.data, class_bytes(size_class), block.region, size_class};
    }
  }
  size_t bytes = align_up(size, kPageSize);
  uint8_t* base = map_memory(bytes, false);
  if (base == nullptr) return {};
  std::lock_guard<std::mutex> lock(s.mutex);
  IoRegion region = add_region(s, base, bytes, false);
  s.stats.large_bytes += bytes;
  ++s.stats.blocks_in_use;
  return {base, bytes, region.id, -1};
}

void IoMemory::release(const IoBlock& block) {
  if (block.data == nullptr) return;
  PoolState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.stats.blocks_in_use;
  if (block.size_class >= 0) {
    s.free[block.size_class].push_back({block.data, block.region});
    return;
  }
  // Retire the id before the address can be mapped again.
  s.regions.erase(reinterpret_cast<uintptr_t>(block.data));
  s.retired.push_back(block.region);
  if (s.retired.size() > kRetiredRemembered) s.retired.pop_front();
  s.stats.large_bytes -= block.size;
  ++s.stats.regions_retired;
  retired_count_.fetch_add(1, std::memory_order_release);
  munmap(block.data, block.size);
}

bool IoMemory::find(const void* p, size_t bytes, IoRegion* region) const {
  PoolState& s = state();
  auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.regions.upper_bound(address);
  if (it == s.regions.begin()) return false;
  --it;
  const IoRegion& candidate = it->second;
  if (address + bytes > it->first + candidate.bytes) return false;
  *region = candidate;
  return true;
}

bool IoMemory::live(uint64_t region) const {
  PoolState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const auto& [base, candidate] : s.regions) {
    if (candidate.id == region) return true;
  }
  return false;
}

bool IoMemory::retired_since(uint64_t seen, std::vector<uint64_t>* ids) const {
  PoolState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  uint64_t missed = retired_count_.load(std::memory_order_relaxed) - seen;
  if (missed > s.retired.size()) return false;
  ids->insert(ids->end(), s.retired.end() - static_cast<std::ptrdiff_t>(missed), s.retired.end());
  return true;
}

IoMemoryStats IoMemory::stats() const {
  PoolState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

}  // namespace pod_init
