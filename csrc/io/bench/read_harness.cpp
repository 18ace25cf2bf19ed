// The reader's core with no Python above it: random reads of one size at one
// depth, through read_batch_into back to back or a stream of rows (or of
// batches), for a number of seconds. Beside fio on the same file it says how
// much of a gap is the core's and how much the binding's and Python's.
//
//   read_harness FILE [--bs 4096] [--depth 32] [--seconds 5]
//                [--api read|batch|stream|stream-batch] [--backend io_uring|pread]
//
// Prints one line: api, IOPS, GB/s, and the reader's IO latency p50/p99 (us).
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "io/aligned_buffer.hpp"
#include "io/direct_reader.hpp"

namespace {

struct Options {
  std::string path;
  size_t block_size = 4096;
  unsigned depth = 32;
  double seconds = 5;
  std::string api = "batch";
  pod_init::BackendChoice backend = pod_init::BackendChoice::IoUring;
};

int usage(const char* why) {
  std::fprintf(stderr,
               "read_harness: %s\nusage: read_harness FILE [--bs N] [--depth N] [--seconds S] "
               "[--api read|batch|stream|stream-batch] [--backend io_uring|pread]\n",
               why);
  return 2;
}

bool parse(int argc, char** argv, Options* options, const char** why) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      options->path = arg;
      continue;
    }
    if (i + 1 >= argc) {
      *why = "an option without its value";
      return false;
    }
    const char* value = argv[++i];
    char* end = nullptr;
    errno = 0;
    if (arg == "--bs") {
      options->block_size = std::strtoull(value, &end, 10);
    } else if (arg == "--depth") {
      options->depth = static_cast<unsigned>(std::strtoul(value, &end, 10));
    } else if (arg == "--seconds") {
      options->seconds = std::strtod(value, &end);
    } else if (arg == "--api") {
      options->api = value;
      end = const_cast<char*>(value) + std::strlen(value);
    } else if (arg == "--backend") {
      options->backend = std::string(value) == "pread" ? pod_init::BackendChoice::Pread
                                                       : pod_init::BackendChoice::IoUring;
      end = const_cast<char*>(value) + std::strlen(value);
    } else {
      *why = "an option it does not know";
      return false;
    }
    if (errno != 0 || end == value || *end != '\0') {
      *why = "a value that is not a number";
      return false;
    }
  }
  if (options->path.empty()) *why = "no FILE";
  if (options->block_size == 0 || options->block_size % 512 != 0) *why = "--bs: a multiple of 512";
  if (options->depth == 0 || options->depth > 4096) *why = "--depth: 1 to 4096";
  if (options->api != "read" && options->api != "batch" && options->api != "stream" &&
      options->api != "stream-batch")
    *why = "--api: read, batch, stream or stream-batch";
  return *why == nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const char* why = nullptr;
  if (!parse(argc, argv, &options, &why)) return usage(why);
  try {
    pod_init::DirectReader reader(options.path, options.depth, options.backend);
    const uint64_t blocks = reader.size() / options.block_size;
    if (blocks == 0) return usage("FILE holds less than one block");
    std::mt19937_64 random(std::random_device{}());
    std::uniform_int_distribution<uint64_t> pick(0, blocks - 1);
    auto offsets = [&](size_t count) {
      std::vector<uint64_t> out(count);
      for (uint64_t& offset : out) offset = pick(random) * options.block_size;
      return out;
    };
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.seconds));
    const auto began = Clock::now();
    uint64_t rows = 0;
    pod_init::ReaderStats stats;
    if (options.api == "read") {  // one read_into per IO: the depth is 1
      pod_init::AlignedBuffer row(options.block_size);
      while (Clock::now() < deadline) {
        for (uint64_t offset : offsets(64))
          reader.read_into(row.data(), options.block_size, offset);
        rows += 64;
      }
      stats = reader.stats();
    } else if (options.api == "batch") {
      pod_init::AlignedBuffer rows_memory(options.depth * options.block_size);
      while (Clock::now() < deadline) {
        reader.read_batch_into(offsets(options.depth), options.block_size, rows_memory.data());
        rows += options.depth;
      }
      stats = reader.stats();
    } else {
      const size_t batch = options.api == "stream-batch" ? options.depth : 0;
      while (Clock::now() < deadline) {
        auto stream = reader.stream(offsets(1 << 16), options.block_size, {}, batch, options.depth);
        pod_init::DirectReader::Stream::Item item;
        while (stream->next(&item)) {
          rows += item.rows;
          if ((rows & 63) == 0 && Clock::now() > deadline) break;
        }
        stream->close();
        stats.add(stream->stats());
      }
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - began).count();
    const auto count = static_cast<double>(rows);
    std::printf("%s %.0f IOPS %.3f GB/s p50 %.1f us p99 %.1f us\n", options.api.c_str(),
                count / elapsed, count * static_cast<double>(options.block_size) / elapsed / 1e9,
                static_cast<double>(stats.io_latency.percentile_ns(0.5)) / 1e3,
                static_cast<double>(stats.io_latency.percentile_ns(0.99)) / 1e3);
    return 0;
  } catch (const pod_init::SysError& e) {
    std::fprintf(stderr, "read_harness: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "read_harness: %s\n", e.what());
    return 2;
  }
}
