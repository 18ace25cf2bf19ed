#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/file_snapshot.hpp"
#include "common/tests/temp_folder_test.hpp"

namespace pod_init {
namespace {

class Snapshot : public TempFolderTest {
 protected:
  Snapshot() : TempFolderTest("/tmp/pod-init-snapshot-XXXXXX") {}
  void SetUp() override {
    TempFolderTest::SetUp();
    if (HasFatalFailure()) return;
    for (const char* name : {"a.py", "b.py", "c.py"}) write(name, "x = 1\n");
  }

  std::string path(const std::string& name) const { return root_ + "/" + name; }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(path(name)) << text;
  }
  FileSnapshot three() const { return FileSnapshot({path("a.py"), path("b.py"), path("c.py")}); }
  // A file's access and modification times, and those times given to a file.
  std::array<struct timespec, 2> times_of(const std::string& name) const {
    struct stat info {};
    EXPECT_EQ(stat(path(name).c_str(), &info), 0);
    return {info.st_atim, info.st_mtim};
  }
  void set_times(const std::string& name, const std::array<struct timespec, 2>& times) {
    ASSERT_EQ(utimensat(AT_FDCWD, path(name).c_str(), times.data(), 0), 0);
  }
};

TEST_F(Snapshot, UnchangedFilesAreNoChange) {
  FileSnapshot snapshot = three();
  EXPECT_EQ(snapshot.paths().size(), 3u);
  EXPECT_EQ(snapshot.first_change().index, -1);
}

TEST_F(Snapshot, AFileThatCannotBeStatedIsLeftOut) {
  FileSnapshot snapshot({path("a.py"), path("none.py"), path("c.py")});
  ASSERT_EQ(snapshot.paths().size(), 2u);
  EXPECT_EQ(snapshot.paths()[1], path("c.py"));
  EXPECT_EQ(snapshot.first_change().index, -1);
}

TEST_F(Snapshot, ANewTimeIsAChange) {
  FileSnapshot snapshot = three();
  struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 5}};
  ASSERT_EQ(utimensat(AT_FDCWD, path("b.py").c_str(), times, 0), 0);
  FileSnapshot::Change change = snapshot.first_change();
  EXPECT_EQ(change.index, 1);
  EXPECT_EQ(change.err, 0);
}

TEST_F(Snapshot, ANewSizeIsAChangeEvenAtTheSameTime) {
  FileSnapshot snapshot = three();
  std::array<struct timespec, 2> before = times_of("c.py");
  write("c.py", "x = 10\n");
  set_times("c.py", before);
  EXPECT_EQ(snapshot.first_change().index, 2);
}

TEST_F(Snapshot, AReplacedFileIsAChangeEvenWithTheSameTimeAndSize) {
  FileSnapshot snapshot = three();
  write("a.new", "x = 2\n");
  set_times("a.new", times_of("a.py"));
  ASSERT_EQ(rename(path("a.new").c_str(), path("a.py").c_str()), 0);
  EXPECT_EQ(snapshot.first_change().index, 0);
}

TEST_F(Snapshot, ARemovedFileIsAChangeWithItsErrno) {
  FileSnapshot snapshot = three();
  ASSERT_EQ(unlink(path("b.py").c_str()), 0);
  FileSnapshot::Change change = snapshot.first_change();
  EXPECT_EQ(change.index, 1);
  EXPECT_EQ(change.err, ENOENT);
}

TEST_F(Snapshot, AmongThousandsTheFirstChangedFileIsFound) {
  std::vector<std::string> paths;
  for (int i = 0; i < 3000; ++i) {
    std::string name = "m" + std::to_string(i) + ".py";
    write(name, "x = 1\n");
    paths.push_back(path(name));
  }
  FileSnapshot snapshot(paths);
  EXPECT_EQ(snapshot.first_change().index, -1);
  ASSERT_EQ(unlink(paths[2999].c_str()), 0);
  EXPECT_EQ(snapshot.first_change().index, 2999);
  write("m1700.py", "x = 100\n");
  EXPECT_EQ(snapshot.first_change().index, 1700);
  EXPECT_EQ(snapshot.first_change().err, 0);
}

}  // namespace
}  // namespace pod_init
