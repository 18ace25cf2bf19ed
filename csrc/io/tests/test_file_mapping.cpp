#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/tests/temp_folder_test.hpp"
#include "io/file_mapping.hpp"

namespace pod_init {
namespace {

class FileMappingTest : public TempFolderTest {
 protected:
  FileMappingTest() : TempFolderTest("/var/tmp/pod-init-mapping-XXXXXX") {}
  void SetUp() override {
    TempFolderTest::SetUp();
    if (HasFatalFailure()) return;
    path_ = root_ + "/data";
    bytes_.resize(5 * page_ + 100);
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = static_cast<uint8_t>(i * 7 + 3);
    std::ofstream(path_, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes_.data()),
               static_cast<std::streamsize>(bytes_.size()));
  }
  std::vector<uint8_t> file_bytes() const {
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  const size_t page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::string path_;
  std::vector<uint8_t> bytes_;
};

TEST_F(FileMappingTest, MapsAStretchPrivatelyAndPopulatesIt) {
  FileMapping mapping;
  // From the second page to the file's last byte (not a whole page).
  const size_t length = bytes_.size() - page_;
  ASSERT_EQ(FileMapping::map(path_, page_, length, &mapping), 0);
  ASSERT_EQ(mapping.size(), length);
  ASSERT_EQ(populate_read(mapping.data() + 10, length - 10), 0);
  std::vector<unsigned char> resident((length + page_ - 1) / page_);
  ASSERT_EQ(mincore(mapping.data(), length, resident.data()), 0);
  for (unsigned char page : resident) EXPECT_TRUE(page & 1);
  EXPECT_EQ(std::vector<uint8_t>(mapping.data(), mapping.data() + length),
            std::vector<uint8_t>(bytes_.begin() + static_cast<long>(page_), bytes_.end()));
  // A write is the process's own: the file keeps its bytes.
  mapping.data()[0] ^= 0xff;
  EXPECT_EQ(file_bytes(), bytes_);
  FileMapping moved = std::move(mapping);
  EXPECT_EQ(mapping.data(), nullptr);
  EXPECT_EQ(moved.data()[1], bytes_[page_ + 1]);
}

TEST_F(FileMappingTest, RefusesWhatCannotBeMapped) {
  FileMapping mapping;
  EXPECT_EQ(FileMapping::map(path_, 100, page_, &mapping), -EINVAL);  // offset not on a page
  EXPECT_EQ(FileMapping::map(path_, 0, 0, &mapping), -EINVAL);
  EXPECT_EQ(FileMapping::map(path_, page_, bytes_.size(), &mapping), -ENODATA);  // past the end
  EXPECT_EQ(FileMapping::map(path_, 8 * page_, 1, &mapping), -ENODATA);
  EXPECT_EQ(FileMapping::map(root_ + "/missing", 0, 1, &mapping), -ENOENT);
  EXPECT_EQ(mapping.data(), nullptr);
}

}  // namespace
}  // namespace pod_init
