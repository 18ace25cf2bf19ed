#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/crc32c.hpp"
#include "common/error.hpp"
#include "common/tests/temp_folder_test.hpp"
#include "io/direct_writer.hpp"

namespace pod_init {
namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class WriterTest : public TempFolderTest {
 protected:
  WriterTest() : TempFolderTest("/var/tmp/pod-init-writer-XXXXXX") {}
};

TEST_F(WriterTest, AReservedHeadIsWrittenLastAndCountsInTheCrc) {
  std::string path = root_ + "/ckpt.bin";
  std::vector<uint8_t> body(3 * DirectWriter::kChunk + 123);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint8_t>(i * 7 + 1);
  std::vector<uint8_t> head(2 * DirectWriter::kHeadAlign, 'h');
  DirectWriter out(path, 0, 4, head.size());
  uint32_t first = out.write(body.data(), 1000);
  uint32_t rest = out.write(body.data() + 1000, body.size() - 1000);
  EXPECT_EQ(first, crc32c(0, body.data(), 1000));  // each call's own bytes
  EXPECT_EQ(rest, crc32c(0, body.data() + 1000, body.size() - 1000));
  EXPECT_EQ(out.bytes(), head.size() + body.size());
  EXPECT_THROW(out.write_head(head.data(), head.size() - 1), InputError);
  out.write_head(head.data(), head.size());
  EXPECT_THROW(out.write_head(head.data(), head.size()), InputError);
  uint32_t crc = out.commit();
  std::vector<uint8_t> expected = head;
  expected.insert(expected.end(), body.begin(), body.end());
  EXPECT_EQ(read_all(path), expected);
  EXPECT_EQ(crc, crc32c(0, expected.data(), expected.size()));
}

TEST_F(WriterTest, AHeadMustBeAlignedAndWrittenBeforeCommit) {
  std::string path = root_ + "/ckpt.bin";
  EXPECT_THROW(DirectWriter(path, 0, 4, 100), InputError);
  DirectWriter out(path, 0, 4, DirectWriter::kHeadAlign);
  uint8_t byte = 1;
  out.write(&byte, 1);
  EXPECT_THROW(out.commit(), InputError);
  out.abort();
  EXPECT_NE(access(path.c_str(), F_OK), 0);  // nothing was published
}

}  // namespace
}  // namespace pod_init
