#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "io/direct_reader.hpp"
#include "io/latency_histogram.hpp"

namespace pod_init {
namespace {

TEST(LatencyHistogram, PercentilesWithinABucket) {
  LatencyHistogram h;
  EXPECT_EQ(h.percentile_ns(0.5), 0u);
  for (uint64_t us = 1; us <= 1000; ++us) h.record(us * 1000);
  EXPECT_EQ(h.count(), 1000u);
  EXPECT_NEAR(static_cast<double>(h.percentile_ns(0.5)), 500e3, 500e3 * 0.07);
  EXPECT_NEAR(static_cast<double>(h.percentile_ns(0.99)), 990e3, 990e3 * 0.07);
  EXPECT_EQ(h.percentile_ns(1.0), 1000000u);  // clamped to the largest sample
  for (int b = 1; b < LatencyHistogram::kBuckets; ++b) {
    ASSERT_LT(LatencyHistogram::bucket_floor_ns(b - 1), LatencyHistogram::bucket_floor_ns(b));
  }
  LatencyHistogram other;
  other.record(7);
  h.merge(other);
  EXPECT_EQ(h.count(), 1001u);
  EXPECT_EQ(h.percentile_ns(0.0), 7u);
}

class ReaderTest : public ::testing::TestWithParam<BackendChoice> {
 protected:
  void SetUp() override {
    // Not under /tmp, which may be tmpfs: the root filesystem takes O_DIRECT.
    char pattern[] = "/var/tmp/direct-reader-XXXXXX";
    int fd = mkstemp(pattern);
    ASSERT_GE(fd, 0);
    path_ = pattern;
    data_.resize((3 << 20) + 1234);
    std::mt19937 rng(42);
    for (auto& byte : data_) byte = static_cast<uint8_t>(rng());
    ASSERT_EQ(write(fd, data_.data(), data_.size()), static_cast<ssize_t>(data_.size()));
    close(fd);
  }
  void TearDown() override { unlink(path_.c_str()); }

  std::string path_;
  std::vector<uint8_t> data_;
};

TEST_P(ReaderTest, AnyOffsetAndLengthMatchesTheFile) {
  DirectReader reader(path_, 8, GetParam());
  EXPECT_TRUE(reader.direct());
  EXPECT_EQ(reader.size(), data_.size());
  EXPECT_EQ(reader.backend(), GetParam() == BackendChoice::Pread ? "pread" : "io_uring");
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    uint64_t offset = rng() % (data_.size() + 100);
    uint64_t length = rng() % (i % 10 == 0 ? 3000000 : 20000);
    DirectReader::Span span = reader.read(offset, length);
    uint64_t expected =
        offset >= data_.size() ? 0 : std::min<uint64_t>(length, data_.size() - offset);
    ASSERT_EQ(span.length, expected) << offset << "+" << length;
    ASSERT_EQ(0, std::memcmp(span.buffer.data() + span.head, data_.data() + offset, expected));

    std::vector<uint8_t> into(length + 1);
    size_t got = reader.read_into(into.data() + 1, length, offset);  // misaligned on purpose
    ASSERT_EQ(got, expected);
    ASSERT_EQ(0, std::memcmp(into.data() + 1, data_.data() + offset, got));
  }
  EXPECT_EQ(reader.read(data_.size(), 10).length, 0u);
  EXPECT_EQ(reader.read(5, 0).length, 0u);
  ReaderStats stats = reader.stats();
  EXPECT_EQ(stats.reads, 600u + 2u - 1u);  // a zero-length read issues nothing and counts nothing
  EXPECT_GT(stats.ios, 0u);
  EXPECT_EQ(stats.io_latency.count(), stats.ios);
}

TEST_P(ReaderTest, BatchRowsAlignedAndNot) {
  DirectReader reader(path_, 4, GetParam());
  std::vector<uint64_t> offsets = {0, 4096, 12345, data_.size() - 4096, 77};
  for (size_t length : {size_t{4096}, size_t{1000}}) {
    OwnedBlock rows = reader.read_batch(offsets, length);
    for (size_t i = 0; i < offsets.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(rows.data() + i * length, data_.data() + offsets[i], length)) << i;
    }
  }
  EXPECT_THROW(reader.read_batch({data_.size() - 10}, 11), InputError);
  EXPECT_THROW(reader.read_batch({0}, uint64_t{1} << 62), InputError);  // not ENOMEM
}

TEST_P(ReaderTest, OneBatchAcrossFiles) {
  // A second file: the first one's bytes reversed, so a row from the wrong file shows.
  std::string second = path_ + ".second";
  std::vector<uint8_t> reversed(data_.rbegin(), data_.rend());
  int fd = open(second.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, reversed.data(), reversed.size()), static_cast<ssize_t>(reversed.size()));
  close(fd);
  DirectReader reader(std::vector<std::string>{path_, second}, 8, GetParam());
  ASSERT_EQ(reader.file_count(), 2u);
  std::vector<uint64_t> offsets = {0, 8192, 333, 4096 * 100, 5};
  std::vector<uint32_t> files = {1, 0, 1, 0, 0};
  const size_t length = 2050;  // a token window: not a multiple of the block
  OwnedBlock rows = reader.read_batch(offsets, length, files);
  for (size_t i = 0; i < offsets.size(); ++i) {
    const std::vector<uint8_t>& source = files[i] == 0 ? data_ : reversed;
    ASSERT_EQ(0, std::memcmp(rows.data() + i * length, source.data() + offsets[i], length)) << i;
  }
  EXPECT_THROW(reader.read_batch({0}, 10, {2}), InputError);
  EXPECT_THROW(reader.read_batch({0, 1}, 10, {0}), InputError);
  unlink(second.c_str());
}

TEST_P(ReaderTest, ResidentRowsComeFromThePageCache) {
  int fd = open(path_.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> warm(data_.size());
  ASSERT_EQ(pread(fd, warm.data(), warm.size(), 0), static_cast<ssize_t>(warm.size()));
  std::vector<uint64_t> offsets = {0, 5000, 70000, data_.size() - 3000};
  const size_t length = 3000;
  {
    DirectReader reader(std::vector<std::string>{path_}, 4, GetParam(), true);
    OwnedBlock rows = reader.read_batch(offsets, length);
    for (size_t i = 0; i < offsets.size(); ++i)
      ASSERT_EQ(0, std::memcmp(rows.data() + i * length, data_.data() + offsets[i], length));
    EXPECT_EQ(reader.stats().page_cache_reads, offsets.size());
    EXPECT_EQ(reader.stats().ios, 0u);
  }
  // Evicted (clean pages drop on request): every row is read from the device.
  ASSERT_EQ(fdatasync(fd), 0);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  close(fd);
  DirectReader reader(std::vector<std::string>{path_}, 4, GetParam(), true);
  OwnedBlock rows = reader.read_batch(offsets, length);
  for (size_t i = 0; i < offsets.size(); ++i)
    ASSERT_EQ(0, std::memcmp(rows.data() + i * length, data_.data() + offsets[i], length));
  EXPECT_EQ(reader.stats().page_cache_reads, 0u);
  EXPECT_GT(reader.stats().ios, 0u);
}

// The resident rows were once copied from the mapping: a file cut short
// after the reader opened it killed the process with SIGBUS.
TEST_P(ReaderTest, AShrunkFileIsENODATAFromTheCacheToo) {
  int fd = open(path_.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> warm(data_.size());
  ASSERT_EQ(pread(fd, warm.data(), warm.size(), 0), static_cast<ssize_t>(warm.size()));
  DirectReader reader(std::vector<std::string>{path_}, 4, GetParam(), true);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(data_.size())), 0);  // grown back: a hole
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  try {
    reader.read_batch({0, 8192}, 4096);
    FAIL() << "no error for a file that shrank";
  } catch (const SysError& e) {
    EXPECT_EQ(e.err(), ENODATA) << e.what();
  }
  // The part still there comes back, from the cache or the device.
  OwnedBlock rows = reader.read_batch({0}, 4096);
  EXPECT_EQ(0, std::memcmp(rows.data(), data_.data(), 4096));
  close(fd);
}

TEST_P(ReaderTest, ForkedChildBuildsItsOwnRing) {
  DirectReader reader(path_, 4, GetParam());
  ASSERT_EQ(reader.read(100, 10).length, 10u);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DirectReader::Span span = reader.read(4000, 5000);
    bool ok = span.length == 5000 &&
              std::memcmp(span.buffer.data() + span.head, data_.data() + 4000, 5000) == 0;
    _exit(ok && reader.stats().reads == 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(reader.read(200, 10).length, 10u);  // the parent's ring still works
}

INSTANTIATE_TEST_SUITE_P(Backends, ReaderTest,
                         ::testing::Values(BackendChoice::IoUring, BackendChoice::Pread));

TEST(DirectReader, ErrorsCarryErrnoAndPath) {
  try {
    DirectReader reader("/nonexistent/file", 8, BackendChoice::Auto);
    FAIL();
  } catch (const SysError& e) {
    EXPECT_EQ(e.err(), ENOENT);
    EXPECT_EQ(e.path(), "/nonexistent/file");
  }
  try {
    DirectReader reader("/", 8, BackendChoice::Auto);
    FAIL();
  } catch (const SysError& e) {
    EXPECT_EQ(e.err(), EISDIR);
  }
  EXPECT_THROW(DirectReader("/etc/hostname", 0, BackendChoice::Auto), InputError);
}

}  // namespace
}  // namespace pod_init
