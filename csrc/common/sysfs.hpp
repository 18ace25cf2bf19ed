// Reading sysfs attributes. Every function returns 0 or -errno; parse helpers
// return std::nullopt for content that does not have the expected shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pod_init::sysfs {

// Whole attribute without trailing whitespace. Attributes are small; reads stop
// at `limit` bytes (larger for /proc and module index files).
// Opens a file for reading without blocking on a FIFO or a device (which then
// read as empty; read_text() refuses them with -EINVAL). The descriptor or -errno.
int open_attribute(const std::string& path);
int read_text(const std::string& path, std::string* out, size_t limit = 64 << 10);
// Target of a symbolic link, as stored.
int read_link(const std::string& path, std::string* out);
// Canonical absolute path (all links resolved); -ENOENT for a dangling link.
int resolve(const std::string& path, std::string* out);
// Where the link at `path` leads, by one readlink() and lexical joining; the
// path itself when it is no link. Sysfs links point at real directories, so
// this equals realpath() there at a tenth of the system calls (realpath reads
// every component). -ENOENT when the target does not exist (a dangling link).
// `path` must itself be free of links above its last component.
int resolve_link(const std::string& path, std::string* out);
// "/a/b/../c/./d" -> "/a/c/d"; ".." at the top stays at "/".
std::string normalize_path(std::string_view path);
// Entry names of a directory, sorted, without "." and "..".
int list_dir(const std::string& path, std::vector<std::string>* names);

std::optional<uint64_t> parse_hex(std::string_view text);  // "0x10de" or "10de"
std::optional<int64_t> parse_int(std::string_view text);   // decimal, optional '-'
// "32.0 GT/s PCIe", "8 GT/s", "2.5 GT/s"; nullopt for "Unknown" or garbage.
std::optional<double> parse_link_speed(std::string_view text);
std::string_view basename(std::string_view path);
// Non-empty components of a path, in order.
std::vector<std::string_view> split_path(std::string_view path);

// True for "DDDD:BB:DD.F" (domain may have more than four hex digits, as VMD domains do).
bool is_bdf(std::string_view name);
// The last path component that is a BDF, or "" when there is none.
std::string last_bdf_component(std::string_view path);

}  // namespace pod_init::sysfs
