#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/atomic_file.hpp"
#include "common/tests/temp_folder_test.hpp"

namespace pod_init {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class PublishDirectory : public TempFolderTest {
 protected:
  PublishDirectory() : TempFolderTest("/tmp/pod-init-publish-XXXXXX") {}

  // A folder holding one file, `name`, that says `text`.
  std::string folder(const std::string& dir, const std::string& text) {
    std::string path = root_ + "/" + dir;
    EXPECT_EQ(mkdir(path.c_str(), 0755), 0);
    EXPECT_EQ(write_file_atomically(path + "/file", text), 0);
    return path;
  }
};

TEST_F(PublishDirectory, RenamesIntoAFreeName) {
  std::string staged = folder("staged", "new");
  bool replaced = true;
  std::string failed;
  ASSERT_EQ(publish_directory(staged, root_ + "/ckpt", &replaced, &failed), 0);
  EXPECT_FALSE(replaced);
  EXPECT_EQ(read_all(root_ + "/ckpt/file"), "new");
  EXPECT_NE(access(staged.c_str(), F_OK), 0);
}

TEST_F(PublishDirectory, ExchangesWithThePreviousVersion) {
  std::string target = folder("ckpt", "old");
  std::string staged = folder("staged", "new");
  bool replaced = false;
  std::string failed;
  ASSERT_EQ(publish_directory(staged, target, &replaced, &failed), 0);
  EXPECT_TRUE(replaced);
  EXPECT_EQ(read_all(target + "/file"), "new");
  EXPECT_EQ(read_all(staged + "/file"), "old");  // for the caller to remove
}

TEST_F(PublishDirectory, AFileInTheWayIsAnError) {
  std::string staged = folder("staged", "new");
  ASSERT_EQ(write_file_atomically(root_ + "/ckpt", "a file"), 0);
  bool replaced = false;
  std::string failed;
  EXPECT_EQ(publish_directory(staged, root_ + "/ckpt", &replaced, &failed), -ENOTDIR);
  EXPECT_EQ(failed, root_ + "/ckpt");
  EXPECT_EQ(read_all(staged + "/file"), "new");
}

}  // namespace
}  // namespace pod_init
