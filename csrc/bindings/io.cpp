// Direct IO: the reader, its streams, the writer, the pool and CRC-32C.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/typing.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings/bindings.hpp"
#include "common/atomic_file.hpp"
#include "common/crc32c.hpp"
#include "common/error.hpp"
#include "io/direct_reader.hpp"
#include "io/direct_writer.hpp"
#include "io/file_mapping.hpp"

namespace pod_init::bindings {

namespace {

pod_init::BackendChoice backend_choice(const std::string& name) {
  if (name == "auto") return pod_init::BackendChoice::Auto;
  if (name == "io_uring") return pod_init::BackendChoice::IoUring;
  if (name == "pread") return pod_init::BackendChoice::Pread;
  throw py::value_error("backend must be 'auto', 'io_uring' or 'pread', not '" + name + "'");
}

// A Python int as a byte count or offset: ValueError (never pybind's
// TypeError) when it is negative or past what a file offset can be.
uint64_t non_negative(const py::int_& value, const char* what) {
  int overflow = 0;
  long long number = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (number == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || number < 0) {
    throw py::value_error(std::string(what) + " must be from 0 to 2**63 - 1, not " +
                          std::string(py::str(value)));
  }
  return static_cast<uint64_t>(number);
}

// An array of whole numbers as int64: floats (which would be truncated) are refused.
py::array_t<int64_t, py::array::c_style | py::array::forcecast> whole_numbers(
    const py::array& values, const char* what) {
  char kind = values.dtype().kind();
  if (kind != 'i' && kind != 'u' && values.size() != 0) {  // [] is float64 to numpy
    throw py::value_error(std::string(what) + " must be whole numbers, not " +
                          std::string(py::str(values.dtype())));
  }
  return py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(values);
}

// The one file of a single-file reader; a reader over several has no "the" file.
size_t only_file(const pod_init::DirectReader& r, const char* what) {
  if (r.file_count() != 1) {
    throw py::value_error("the reader holds " + std::to_string(r.file_count()) + " files: use ." +
                          what + "s");
  }
  return 0;
}

// A 1-D or 2-D uint8 array that owns `block` (back to the pool when the array
// dies) and starts at block.data + head.
py::array_t<uint8_t> owning_array(pod_init::OwnedBlock block, size_t head,
                                  std::vector<py::ssize_t> shape) {
  auto* owned = new pod_init::IoBlock(block.take());
  py::capsule owner(owned, [](void* p) {
    auto* released = static_cast<pod_init::IoBlock*>(p);
    pod_init::IoMemory::instance().release(*released);
    delete released;
  });
  std::vector<py::ssize_t> strides(shape.size(), 1);
  if (shape.size() == 2) strides[0] = shape[1];
  return py::array_t<uint8_t>(shape, strides, owned->data + head, owner);
}

// Rows for read_batch and stream: offsets (whole numbers >= 0) and, when given,
// one file index per offset.
std::pair<std::vector<uint64_t>, std::vector<uint32_t>> rows_of(
    const pod_init::DirectReader& r, const py::object& offset_values,
    const std::optional<py::object>& file_values) {
  auto offsets = whole_numbers(py::array::ensure(offset_values), "offsets");
  if (offsets.ndim() != 1) throw py::value_error("offsets must be one-dimensional");
  std::vector<uint64_t> at(static_cast<size_t>(offsets.size()));
  for (size_t i = 0; i < at.size(); ++i) {
    if (offsets.data()[i] < 0) {
      throw py::value_error("offsets must be >= 0, not " + std::to_string(offsets.data()[i]));
    }
    at[i] = static_cast<uint64_t>(offsets.data()[i]);
  }
  std::vector<uint32_t> file_of;
  if (!file_values) return {std::move(at), std::move(file_of)};
  auto files = whole_numbers(py::array::ensure(*file_values), "files");
  if (files.ndim() != 1 || static_cast<size_t>(files.size()) != at.size()) {
    throw py::value_error("files must be one-dimensional, one index per offset");
  }
  file_of.resize(at.size());
  for (size_t i = 0; i < at.size(); ++i) {
    int64_t file = files.data()[i];
    if (file < 0 || static_cast<uint64_t>(file) >= r.file_count()) {
      throw py::value_error("file index " + std::to_string(file) +
                            " out of range: the reader holds " + std::to_string(r.file_count()) +
                            " files");
    }
    file_of[i] = static_cast<uint32_t>(file);
  }
  return {std::move(at), std::move(file_of)};
}

// The buffer's memory, refused (TypeError) unless it is one C-contiguous run.
py::buffer_info contiguous(const py::buffer& data, const char* call) {
  py::buffer_info info = data.request();
  if (!PyBuffer_IsContiguous(info.view(), 'C')) {
    throw py::type_error(std::string(call) + " needs a C-contiguous buffer");
  }
  return info;
}

size_t byte_length(const py::buffer_info& info) {
  return static_cast<size_t>(info.size * info.itemsize);
}

py::dict stats_dict(const pod_init::ReaderStats& stats) {
  const pod_init::LatencyHistogram& h = stats.io_latency;
  auto us = [](uint64_t ns) { return static_cast<double>(ns) / 1e3; };
  py::dict latency;
  latency["p50"] = us(h.percentile_ns(0.50));
  latency["p99"] = us(h.percentile_ns(0.99));
  latency["p99.9"] = us(h.percentile_ns(0.999));
  latency["max"] = us(h.max_ns());
  py::list buckets;
  for (int b = 0; b < pod_init::LatencyHistogram::kBuckets; ++b) {
    if (h.bucket_count(b) > 0) {
      buckets.append(
          py::make_tuple(pod_init::LatencyHistogram::bucket_floor_ns(b), h.bucket_count(b)));
    }
  }
  py::dict out;
  out["reads"] = stats.reads;
  out["bytes"] = stats.bytes;
  out["ios"] = stats.ios;
  out["fixed_ios"] = stats.fixed_ios;
  out["page_cache_reads"] = stats.page_cache_reads;
  out["io_latency_us"] = latency;
  out["io_latency_histogram_ns"] = buckets;
  return out;
}

}  // namespace

void bind_io(py::module_& m) {
  m.def(
      "aligned_empty",
      [](const py::int_& nbytes) {
        uint64_t size = non_negative(nbytes, "nbytes");
        pod_init::OwnedBlock block(size);
        if (block.data() == nullptr) throw std::bad_alloc();  // MemoryError
        return owning_array(std::move(block), 0, {static_cast<py::ssize_t>(size)});
      },
      py::arg("nbytes"),
      "A page-aligned uint8 array (uninitialised) from the reader's pool, whose memory the "
      "ring registers on first use.");

  m.def(
      "map_file",
      [](const std::string& path, const py::int_& offset, const py::int_& length) {
        pod_init::check_path(path);
        uint64_t at = non_negative(offset, "offset");
        uint64_t size = non_negative(length, "length");
        auto mapping = std::make_unique<pod_init::FileMapping>();
        int rc = 0;
        {
          ReleasedGil release;
          rc = pod_init::FileMapping::map(path, at, size, mapping.get());
        }
        if (rc == -EINVAL)
          throw py::value_error(
              "offset must be a multiple of the page size "
              "and length more than 0");
        if (rc == -ENODATA) {
          throw pod_init::SysError(ENODATA,
                                   "map bytes " + std::to_string(at) + " to " +
                                       std::to_string(at + size) + " (past the file's end)",
                                   path);
        }
        if (rc < 0) throw pod_init::SysError(-rc, "map", path);
        uint8_t* data = mapping->data();
        py::capsule owner(mapping.release(),
                          [](void* p) { delete static_cast<pod_init::FileMapping*>(p); });
        return py::array_t<uint8_t>({static_cast<py::ssize_t>(size)}, {py::ssize_t{1}}, data,
                                    owner);
      },
      py::arg("path"), py::arg("offset"), py::arg("length"),
      "[offset, offset + length) of the file at `path`, mapped privately, as a writable uint8 "
      "array: its pages are the page cache's until written to, and a write never reaches the "
      "file. offset a multiple of the page size; the file holds its descriptor no longer.");
  m.def(
      "populate",
      [](const py::buffer& data) {
        py::buffer_info info = contiguous(data, "populate");
        int rc = 0;
        {
          ReleasedGil release;
          rc = pod_init::populate_read(static_cast<const uint8_t*>(info.ptr), byte_length(info));
        }
        if (rc < 0) throw pod_init::SysError(-rc, "madvise(MADV_POPULATE_READ)");
      },
      py::arg("data"),
      "Faults the pages of `data` (a map_file array) in from the page cache, reading what is "
      "not cached, without copying them.");

  using Stream = pod_init::DirectReader::Stream;
  py::class_<Stream>(m, "ReadStream")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [](Stream& s) {
             Stream::Item item;
             bool more = false;
             {
               ReleasedGil release;
               more = s.next(&item);
             }
             if (!more) throw py::stop_iteration();
             auto length = static_cast<py::ssize_t>(s.length());
             if (s.batch() == 0) return owning_array(std::move(item.block), item.head, {length});
             return owning_array(std::move(item.block), 0,
                                 {static_cast<py::ssize_t>(item.rows), length});
           })
      .def("close", &Stream::close, py::call_guard<ReleasedGil>(),
           "Waits for the reads in flight and frees the rows ahead; later next() raises "
           "ValueError.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](Stream& s, const py::args&) {
             ReleasedGil release;
             s.close();
           })
      .def(
          "stats", [](const Stream& s) { return stats_dict(s.stats()); },
          "As DirectReader.stats(), for this stream's reads.")
      .def_property_readonly("remaining", &Stream::remaining, "Rows not yet returned.")
      .def_property_readonly("depth", &Stream::depth)
      .def_property_readonly("backend", &Stream::backend)
      .def_property_readonly("backend_note", &Stream::backend_note,
                             "Why this stream fell back to pread; '' when it did not.")
      .def_property_readonly("closed", &Stream::closed);

  py::class_<pod_init::DirectReader>(m, "DirectReader")
      .def(py::init([](const std::variant<std::string, std::vector<std::string>>& path,
                       int64_t queue_depth, const std::string& backend, bool page_cache) {
             pod_init::BackendChoice choice = backend_choice(backend);
             std::vector<std::string> paths;
             if (const auto* one = std::get_if<std::string>(&path)) {
               paths.push_back(*one);
             } else {
               paths = std::get<std::vector<std::string>>(path);
             }
             if (paths.empty()) throw py::value_error("no paths given");
             ReleasedGil release;
             return std::make_unique<pod_init::DirectReader>(std::move(paths), queue_depth, choice,
                                                             page_cache);
           }),
           py::arg("path"), py::arg("queue_depth") = 32, py::arg("backend") = "auto",
           py::arg("page_cache") = false,
           "Opens path (a file or block device, or a list of them) with O_DIRECT; OSError when "
           "one cannot be opened. page_cache: copy batch rows whose pages are all resident.")
      .def(
          "read",
          [](pod_init::DirectReader& r, const py::int_& offset, const py::int_& length) {
            uint64_t off = non_negative(offset, "offset");
            uint64_t len = non_negative(length, "length");
            pod_init::DirectReader::Span span;
            {
              ReleasedGil release;
              span = r.read(off, len, static_cast<uint32_t>(only_file(r, "path")));
            }
            size_t head = span.head, got = span.length;
            return owning_array(std::move(span.buffer), head, {static_cast<py::ssize_t>(got)});
          },
          py::arg("offset"), py::arg("length"),
          "length bytes at offset as an owning uint8 array (shorter at the end of the file).")
      .def(
          "read_into",
          [](pod_init::DirectReader& r, py::buffer buffer, const py::int_& offset) {
            uint64_t off = non_negative(offset, "offset");
            py::buffer_info info = buffer.request(true);
            if (!PyBuffer_IsContiguous(info.view(), 'C')) {
              throw py::type_error("read_into needs a C-contiguous buffer");
            }
            auto* dst = static_cast<uint8_t*>(info.ptr);
            size_t length = static_cast<size_t>(info.size * info.itemsize);
            ReleasedGil release;
            return r.read_into(dst, length, off, static_cast<uint32_t>(only_file(r, "path")));
          },
          py::arg("buffer"), py::arg("offset"),
          "Fills a writable buffer from offset; returns the bytes read.")
      .def(
          "read_batch",
          [](pod_init::DirectReader& r, const py::object& offset_values, const py::int_& length,
             std::optional<py::buffer> out,
             const std::optional<py::object>& file_values) -> py::object {
            uint64_t len = non_negative(length, "length");
            auto [at, file_of] = rows_of(r, offset_values, file_values);
            if (out) {
              py::buffer_info info = out->request(true);
              size_t bytes = static_cast<size_t>(info.size * info.itemsize);
              if (!PyBuffer_IsContiguous(info.view(), 'C') || bytes != at.size() * len) {
                throw py::value_error("out must be a C-contiguous writable buffer of " +
                                      std::to_string(at.size() * len) + " bytes");
              }
              auto* dst = static_cast<uint8_t*>(info.ptr);
              ReleasedGil release;
              r.read_batch_into(at, len, dst, file_of);
              return *out;
            }
            pod_init::OwnedBlock rows;
            {
              ReleasedGil release;
              rows = r.read_batch(at, len, file_of);
            }
            return owning_array(
                std::move(rows), 0,
                {static_cast<py::ssize_t>(at.size()), static_cast<py::ssize_t>(len)});
          },
          py::arg("offsets"), py::arg("length"), py::arg("out") = py::none(),
          py::arg("files") = py::none(),
          "Rows of length bytes, one per offset (in file files[i], else the only file), all read "
          "with the queue kept full; into `out` (reused between calls) when given, else a new "
          "(n, length) uint8 array.")
      .def(
          "_submit_batch",
          [](pod_init::DirectReader& r, const py::object& offset_values, const py::int_& length,
             const std::optional<py::object>& file_values) {
            uint64_t len = non_negative(length, "length");
            auto [at, file_of] = rows_of(r, offset_values, file_values);
            uint64_t ticket;
            {
              ReleasedGil release;
              ticket = r.submit_batch(at, len, file_of);
            }
            return py::make_tuple(ticket, at.size(), len);
          },
          py::arg("offsets"), py::arg("length"), py::arg("files") = py::none())
      .def(
          "_wait_batch",
          [](pod_init::DirectReader& r, uint64_t ticket, py::ssize_t rows, py::ssize_t length) {
            pod_init::OwnedBlock block;
            {
              ReleasedGil release;
              block = r.wait_batch(ticket);
            }
            return owning_array(std::move(block), 0, {rows, length});
          },
          py::arg("ticket"), py::arg("rows"), py::arg("length"))
      .def_property_readonly("batches_pending", &pod_init::DirectReader::batches_pending,
                             "Batches submitted and not yet waited for.")
      .def(
          "stream",
          [](pod_init::DirectReader& r, const py::object& offset_values, const py::int_& length,
             std::optional<int64_t> depth, const std::optional<py::object>& file_values,
             std::optional<int64_t> batch) {
            uint64_t len = non_negative(length, "length");
            auto [at, file_of] = rows_of(r, offset_values, file_values);
            if (batch && *batch < 1) {
              throw py::value_error("batch must be >= 1, not " + std::to_string(*batch));
            }
            int64_t in_flight = depth ? *depth : static_cast<int64_t>(r.queue_depth());
            ReleasedGil release;
            return r.stream(std::move(at), len, std::move(file_of),
                            batch ? static_cast<size_t>(*batch) : 0, in_flight);
          },
          py::arg("offsets"), py::arg("length"), py::arg("depth") = py::none(),
          py::arg("files") = py::none(), py::arg("batch") = py::none(),
          "An iterator over the rows (each a uint8 array of length bytes), or over batches of "
          "`batch` rows ((rows, length) arrays), in order, with `depth` reads (default: the "
          "reader's queue depth) kept in flight while the caller works.")
      .def(
          "stats", [](const pod_init::DirectReader& r) { return stats_dict(r.stats()); },
          "reads, bytes, ios, page_cache_reads and the IO latency (µs percentiles, histogram).")
      .def("close", &pod_init::DirectReader::close, py::call_guard<ReleasedGil>(),
           "Closes the files once calls in other threads have finished; later calls raise "
           "ValueError.")
      .def_property_readonly(
          "path",
          [](const pod_init::DirectReader& r) { return fs_str(r.path(only_file(r, "path"))); },
          "The file of a single-file reader.")
      .def_property_readonly(
          "size", [](const pod_init::DirectReader& r) { return r.size(only_file(r, "size")); },
          "Bytes at open, of a single-file reader.")
      .def_property_readonly("paths",
                             [](const pod_init::DirectReader& r) {
                               py::typing::List<py::str> paths;
                               for (size_t i = 0; i < r.file_count(); ++i)
                                 paths.append(fs_str(r.path(i)));
                               return paths;
                             })
      .def_property_readonly(
          "sizes",
          [](const pod_init::DirectReader& r) {
            std::vector<uint64_t> sizes;
            for (size_t i = 0; i < r.file_count(); ++i) sizes.push_back(r.size(i));
            return sizes;
          },
          "Bytes at open, per file.")
      .def_property_readonly("page_cache", &pod_init::DirectReader::page_cache)
      .def_property_readonly("block_size", &pod_init::DirectReader::block_size,
                             "Offset alignment of direct reads.")
      .def_property_readonly("memory_alignment", &pod_init::DirectReader::memory_alignment)
      .def_property_readonly("direct", &pod_init::DirectReader::direct,
                             "False when the filesystem refused O_DIRECT for a file.")
      .def_property_readonly("queue_depth", &pod_init::DirectReader::queue_depth)
      .def_property_readonly("backend", &pod_init::DirectReader::backend, "io_uring or pread.")
      .def_property_readonly("backend_note", &pod_init::DirectReader::backend_note)
      .def_property_readonly("closed", &pod_init::DirectReader::closed);

  m.def(
      "crc32c",
      [](const py::buffer& data, uint32_t value) {
        py::buffer_info info = contiguous(data, "crc32c");
        ReleasedGil release;
        return pod_init::crc32c(value, info.ptr, byte_length(info));
      },
      py::arg("data"), py::arg("value") = 0,
      "CRC-32C of data, continuing `value` (the CRC of what came before).");
  m.def("crc32c_combine", &pod_init::crc32c_combine, py::arg("first"), py::arg("second"),
        py::arg("second_length"),
        "The CRC-32C of two pieces one after the other, from theirs and the second's length.");
  m.attr("CHECKSUM_ATTRIBUTE") = pod_init::kChecksumAttribute;

  m.def(
      "publish_directory",
      [](const std::string& staged, const std::string& target) {
        bool replaced = false;
        std::string failed;
        int rc = 0;
        {
          ReleasedGil release;
          rc = pod_init::publish_directory(staged, target, &replaced, &failed);
        }
        if (rc < 0) throw pod_init::SysError(-rc, "rename", failed);
        return replaced;
      },
      py::arg("staged"), py::arg("target"),
      "Puts the synced folder `staged` in place of `target` in one step (a rename, or an "
      "exchange when target exists); True when it replaced one, whose old version `staged` "
      "then names. The parent folder is synced.");

  m.def(
      "memory_stats",
      [] {
        pod_init::IoMemoryStats stats = pod_init::IoMemory::instance().stats();
        py::dict out;
        out["arena_bytes"] = stats.arena_bytes;
        out["large_bytes"] = stats.large_bytes;
        out["blocks_in_use"] = stats.blocks_in_use;
        out["regions_retired"] = stats.regions_retired;
        return out;
      },
      "The pool behind read(), read_batch(), aligned_empty() and the streams: arena bytes "
      "(mapped once, kept), bytes of large blocks in use, blocks in use, large blocks returned.");

  py::class_<pod_init::DirectWriter>(m, "DirectWriter")
      .def(py::init([](const std::string& path, const py::int_& size, int64_t queue_depth,
                       const py::int_& head_bytes) {
             uint64_t expected = non_negative(size, "size");
             uint64_t head = non_negative(head_bytes, "head_bytes");
             ReleasedGil release;
             return std::make_unique<pod_init::DirectWriter>(path, expected, queue_depth, head);
           }),
           py::arg("path"), py::arg("size") = 0, py::arg("queue_depth") = 32,
           py::arg("head_bytes") = 0,
           "Starts a new file that will replace path on commit(); size (when known) is checked "
           "against the free space now, so a disk without room fails before anything is written. "
           "head_bytes (a multiple of 4096) are left at the start for write_head().")
      .def(
          "write",
          [](pod_init::DirectWriter& w, const py::buffer& data) {
            py::buffer_info info = contiguous(data, "write");
            ReleasedGil release;
            return w.write(static_cast<const uint8_t*>(info.ptr), byte_length(info));
          },
          py::arg("data"),
          "Appends data (any C-contiguous buffer); returns the CRC-32C of that data alone.")
      .def(
          "write_head",
          [](pod_init::DirectWriter& w, const py::buffer& data) {
            py::buffer_info info = contiguous(data, "write_head");
            ReleasedGil release;
            w.write_head(static_cast<const uint8_t*>(info.ptr), byte_length(info));
          },
          py::arg("data"), "Writes the head_bytes reserved at the start (once, before commit).")
      .def("commit", &pod_init::DirectWriter::commit, py::call_guard<ReleasedGil>(),
           "Syncs the file, renames it over path, syncs the folder; returns the CRC-32C.")
      .def("abort", &pod_init::DirectWriter::abort, py::call_guard<ReleasedGil>(),
           "Discards the new file; path stays as it was.")
      .def(
          "stats",
          [](const pod_init::DirectWriter& w) {
            pod_init::ReaderStats stats;
            static_cast<pod_init::IoCounters&>(stats) = w.stats();
            stats.bytes = w.bytes();
            return stats_dict(stats);
          },
          "bytes, ios (writes issued), fixed_ios and their latency, as DirectReader.stats().")
      .def_property_readonly("path",
                             [](const pod_init::DirectWriter& w) { return fs_str(w.path()); })
      .def_property_readonly("bytes", &pod_init::DirectWriter::bytes,
                             "The file's size so far, a reserved head included.")
      .def_property_readonly("crc", &pod_init::DirectWriter::crc,
                             "CRC-32C of the content so far (after a reserved head, until "
                             "write_head()).")
      .def_property_readonly("direct", &pod_init::DirectWriter::direct)
      .def_property_readonly("note", &pod_init::DirectWriter::note)
      .def_property_readonly("closed", [](const pod_init::DirectWriter& w) { return !w.open(); });
}

}  // namespace pod_init::bindings
