// A fixture's own folder: made before each test from a mkdtemp() pattern,
// removed with everything in it after. Fixtures whose files need O_DIRECT
// take /var/tmp (/tmp may be tmpfs). A derived SetUp() calls this one first
// and returns when it failed (HasFatalFailure()): root_ is then empty.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <string>
#include <utility>

namespace pod_init {

class TempFolderTest : public ::testing::Test {
 protected:
  explicit TempFolderTest(std::string pattern) : pattern_(std::move(pattern)) {}
  void SetUp() override {
    std::string made = pattern_;
    ASSERT_NE(mkdtemp(made.data()), nullptr) << pattern_;
    root_ = made;
  }
  void TearDown() override {
    if (!root_.empty()) {
      ASSERT_EQ(std::system(("rm -rf '" + root_ + "'").c_str()), 0);
    }
  }

  std::string root_;

 private:
  std::string pattern_;
};

}  // namespace pod_init
