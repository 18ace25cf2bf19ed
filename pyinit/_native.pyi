"""
pod-init native core: PCIe topology scan and NCCL configuration
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
import typing_extensions
__all__: list[str] = ['CHECKSUM_ATTRIBUTE', 'DirectReader', 'DirectWriter', 'FileSnapshot', 'MAX_CHANNELS', 'MAX_EXPECTED_GPUS', 'MAX_HOSTS', 'MAX_QUEUE_DEPTH', 'NcclConfig', 'NodeList', 'NvmlGpus', 'ReadStream', 'Topology', 'aligned_empty', 'become_subreaper', 'crc32c', 'crc32c_combine', 'die_with_parent', 'end_children', 'expand_nodelist', 'io_priority', 'load_node_list', 'load_topology', 'map_file', 'memory_stats', 'nccl_config', 'populate', 'publish_directory', 'read_boot_id', 'route_to', 'scan_topology', 'set_arguments_shown', 'set_io_priority', 'supervise', 'tuning_table_rules']
class Topology:
    def expect_gpus(self, count: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Replaces the GPU-count finding with one for this expectation.
        """
    def merge_nvlinks(self, details: collections.abc.Mapping[str, tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, collections.abc.Sequence[tuple[str, str, typing.SupportsInt | typing.SupportsIndex]]]]) -> None:
        """
        Adds NVLink counts (NV#) to the matrix from NVML's view.
        """
    def to_json(self) -> str:
        """
        The document `pod-init topo --json` prints.
        """
    def to_text(self) -> str:
        """
        The matrix `pod-init topo` prints.
        """
    @property
    def has_errors(self) -> bool:
        """
        True when a finding has severity error.
        """
    @property
    def sysfs_root(self) -> str:
        """
        The tree it was scanned from.
        """
class NcclConfig:
    def summary(self) -> str:
        """
        What `pod-init nccl` prints.
        """
    def write(self) -> None:
        """
        Writes every file under out_dir, each whole or not at all.
        """
    @property
    def env(self) -> dict[str, str]:
        """
        The env file's settings (the environment's values where it had them).
        """
    @property
    def files(self) -> dict[str, str]:
        """
        File name -> content, as write() puts them in out_dir.
        """
    @property
    def node_rank(self) -> int:
        ...
    @property
    def out_dir(self) -> str:
        ...
    @property
    def ring(self) -> list[int]:
        """
        GPU indices in ring order.
        """
class NodeList:
    @property
    def addresses(self) -> list[str]:
        """
        Every node's address, node 0 (the master) first.
        """
    @property
    def interface(self) -> str:
        """
        The interface holding this node's address.
        """
    @property
    def node_rank(self) -> int:
        """
        This node's index.
        """
    @property
    def planned_elsewhere(self) -> bool:
        """
        node_rank was given (--node), not found among this machine's addresses.
        """
    @property
    def source(self) -> str:
        """
        The hostfile.
        """
class FileSnapshot:
    """
    Files (bytes paths) as they are on disk now: time, size, inode; one that cannot be stat'ed is left out.
    """
    def __init__(self, paths: collections.abc.Sequence[str]) -> None:
        ...
    def __len__(self) -> int:
        ...
    def first_change(self) -> tuple[bytes, int] | None:
        """
        None, or (path, errno) of the first file changed since: errno 0 when it is there with another time, size or inode.
        """
class ReadStream:
    def __enter__(self) -> typing.Any:
        ...
    def __exit__(self, *args) -> None:
        ...
    def __iter__(self) -> typing.Any:
        ...
    def __next__(self) -> numpy.typing.NDArray[numpy.uint8]:
        ...
    def close(self) -> None:
        """
        Waits for the reads in flight and frees the rows ahead; later next() raises ValueError.
        """
    def stats(self) -> dict:
        """
        As DirectReader.stats(), for this stream's reads.
        """
    @property
    def backend(self) -> str:
        ...
    @property
    def backend_note(self) -> str:
        """
        Why this stream fell back to pread; '' when it did not.
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def depth(self) -> int:
        ...
    @property
    def remaining(self) -> int:
        """
        Rows not yet returned.
        """
class DirectReader:
    def __init__(self, path: str | collections.abc.Sequence[str], queue_depth: typing.SupportsInt | typing.SupportsIndex = 32, backend: str = 'auto', page_cache: bool = False) -> None:
        """
        Opens path (a file or block device, or a list of them) with O_DIRECT; OSError when one cannot be opened. page_cache: copy batch rows whose pages are all resident.
        """
    def _submit_batch(self, offsets: typing.Any, length: int, files: typing.Any | None = None) -> tuple[int, int, int]:
        ...
    def _wait_batch(self, ticket: typing.SupportsInt | typing.SupportsIndex, rows: typing.SupportsInt | typing.SupportsIndex, length: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint8]:
        ...
    def close(self) -> None:
        """
        Closes the files once calls in other threads have finished; later calls raise ValueError.
        """
    def read(self, offset: int, length: int) -> numpy.typing.NDArray[numpy.uint8]:
        """
        length bytes at offset as an owning uint8 array (shorter at the end of the file).
        """
    def read_batch(self, offsets: typing.Any, length: int, out: typing_extensions.Buffer | None = None, files: typing.Any | None = None) -> typing.Any:
        """
        Rows of length bytes, one per offset (in file files[i], else the only file), all read with the queue kept full; into `out` (reused between calls) when given, else a new (n, length) uint8 array.
        """
    def read_into(self, buffer: typing_extensions.Buffer, offset: int) -> int:
        """
        Fills a writable buffer from offset; returns the bytes read.
        """
    def stats(self) -> dict:
        """
        reads, bytes, ios, page_cache_reads and the IO latency (µs percentiles, histogram).
        """
    def stream(self, offsets: typing.Any, length: int, depth: typing.SupportsInt | typing.SupportsIndex | None = None, files: typing.Any | None = None, batch: typing.SupportsInt | typing.SupportsIndex | None = None) -> ReadStream:
        """
        An iterator over the rows (each a uint8 array of length bytes), or over batches of `batch` rows ((rows, length) arrays), in order, with `depth` reads (default: the reader's queue depth) kept in flight while the caller works.
        """
    @property
    def backend(self) -> str:
        """
        io_uring or pread.
        """
    @property
    def backend_note(self) -> str:
        ...
    @property
    def batches_pending(self) -> int:
        """
        Batches submitted and not yet waited for.
        """
    @property
    def block_size(self) -> int:
        """
        Offset alignment of direct reads.
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def direct(self) -> bool:
        """
        False when the filesystem refused O_DIRECT for a file.
        """
    @property
    def memory_alignment(self) -> int:
        ...
    @property
    def page_cache(self) -> bool:
        ...
    @property
    def path(self) -> str:
        """
        The file of a single-file reader.
        """
    @property
    def paths(self) -> list[str]:
        ...
    @property
    def queue_depth(self) -> int:
        ...
    @property
    def size(self) -> int:
        """
        Bytes at open, of a single-file reader.
        """
    @property
    def sizes(self) -> list[int]:
        """
        Bytes at open, per file.
        """
class DirectWriter:
    def __init__(self, path: str, size: int = 0, queue_depth: typing.SupportsInt | typing.SupportsIndex = 32, head_bytes: int = 0) -> None:
        """
        Starts a new file that will replace path on commit(); size (when known) is checked against the free space now, so a disk without room fails before anything is written. head_bytes (a multiple of 4096) are left at the start for write_head().
        """
    def abort(self) -> None:
        """
        Discards the new file; path stays as it was.
        """
    def commit(self) -> int:
        """
        Syncs the file, renames it over path, syncs the folder; returns the CRC-32C.
        """
    def stats(self) -> dict:
        """
        bytes, ios (writes issued), fixed_ios and their latency, as DirectReader.stats().
        """
    def write(self, data: typing_extensions.Buffer) -> int:
        """
        Appends data (any C-contiguous buffer); returns the CRC-32C of that data alone.
        """
    def write_head(self, data: typing_extensions.Buffer) -> None:
        """
        Writes the head_bytes reserved at the start (once, before commit).
        """
    @property
    def bytes(self) -> int:
        """
        The file's size so far, a reserved head included.
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def crc(self) -> int:
        """
        CRC-32C of the content so far (after a reserved head, until write_head()).
        """
    @property
    def direct(self) -> bool:
        ...
    @property
    def note(self) -> str:
        ...
    @property
    def path(self) -> str:
        ...
class NvmlGpus:
    """
    NVML's answers about this node's GPUs, each by NVML's index. A query NVML refuses raises pyinit.nvml.NvmlUnavailable naming the call and GPU.
    """
    def __init__(self) -> None:
        ...
    def bar1_total(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def bus_id(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> str:
        ...
    def common_ancestor(self, a: typing.SupportsInt | typing.SupportsIndex, b: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def counters(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> dict:
        """
        What the monitor samples, now.
        """
    def cuda_capability(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int]:
        ...
    def driver_version(self) -> str:
        ...
    def health(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> dict:
        """
        ECC mode, uncorrected errors since the driver loaded, row remapping; None where the GPU has no answer.
        """
    def memory_total(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def name(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> str:
        ...
    def nvlinks(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> list[tuple[int, str, int | None]]:
        """
        Active links: (link, remote bus id, nvmlIntNvLinkDeviceType_t or None).
        """
    def open(self, library: str = 'libnvidia-ml.so.1') -> str:
        """
        Loads NVML (a name the loader searches for, or a file) and initialises it: '' or why not, in one line.
        """
    def p2p_status(self, a: typing.SupportsInt | typing.SupportsIndex, b: typing.SupportsInt | typing.SupportsIndex, capability: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def pcie_link(self, gpu: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int, int, int]:
        """
        (current generation, max generation, current width, max width)
        """
    def watch_xids(self, gpus: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> bool:
        """
        Xid events from these GPUs from now on; False where none can be delivered.
        """
    def xid_events(self) -> list[tuple[int, int]]:
        """
        (GPU, Xid) for each event since the last call; never blocks.
        """
    @property
    def count(self) -> int:
        ...
def aligned_empty(nbytes: int) -> numpy.typing.NDArray[numpy.uint8]:
    """
    A page-aligned uint8 array (uninitialised) from the reader's pool, whose memory the ring registers on first use.
    """
def become_subreaper() -> None:
    """
    Orphaned descendants re-parent to this process (PR_SET_CHILD_SUBREAPER).
    """
def crc32c(data: typing_extensions.Buffer, value: typing.SupportsInt | typing.SupportsIndex = 0) -> int:
    """
    CRC-32C of data, continuing `value` (the CRC of what came before).
    """
def crc32c_combine(first: typing.SupportsInt | typing.SupportsIndex, second: typing.SupportsInt | typing.SupportsIndex, second_length: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    The CRC-32C of two pieces one after the other, from theirs and the second's length.
    """
def die_with_parent(signal: typing.SupportsInt | typing.SupportsIndex, parent: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    This process gets `signal` when its parent dies (at once if `parent` is gone already).
    """
def end_children(grace_s: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> int:
    """
    Ends every process still a child of this one, orphans that re-parent here included: TERM, grace_s for them to end, then KILL; returns how many were signalled.
    """
def expand_nodelist(nodelist: str) -> list[str]:
    """
    node[01-03],gpu-a -> [node01, node02, node03, gpu-a] (SLURM style).
    """
def io_priority(pid: typing.SupportsInt | typing.SupportsIndex = 0) -> int:
    """
    The IO priority of process `pid` (0: this one) as ioprio_get(2) gives it (class << 13 | level), as ionice(1) sets it.
    """
def load_node_list(hostfile: str, hostfile_text: str = '', node: typing.SupportsInt | typing.SupportsIndex = -1) -> NodeList:
    """
    This node among the nodes of a hostfile of IP addresses (hostfile_text instead of reading the file when given; the path still names errors), or node `node` of them when it is not -1 (a plan for another machine). InputError for bad content, OSError when the file cannot be read.
    """
def load_topology(text: str, source: str) -> Topology:
    """
    The Topology a `pod-init topo --json` document describes (a scan reused, not repeated). InputError naming source when it is not one.
    """
def map_file(path: str, offset: int, length: int) -> numpy.typing.NDArray[numpy.uint8]:
    """
    [offset, offset + length) of the file at `path`, mapped privately, as a writable uint8 array: its pages are the page cache's until written to, and a write never reaches the file. offset a multiple of the page size; the file holds its descriptor no longer.
    """
def memory_stats() -> dict:
    """
    The pool behind read(), read_batch(), aligned_empty() and the streams: arena bytes (mapped once, kept), bytes of large blocks in use, blocks in use, large blocks returned.
    """
def nccl_config(topology: Topology, *, nodes: ... | None = None, hints: str = '', out_dir: str = '.', socket_ifname: str = '', force_rings: bool = False, channels: typing.SupportsInt | typing.SupportsIndex = 0, details: collections.abc.Mapping[str, tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex, collections.abc.Sequence[tuple[str, str, typing.SupportsInt | typing.SupportsIndex]]]] = {}, environment: collections.abc.Mapping[str, str] = {}, proc_root: str = '/proc', tuned_env: collections.abc.Mapping[str, str] = {}, tuning_table: str = '') -> NcclConfig:
    """
    Builds the NCCL configuration from a scanned topology and a node list (nothing is written until write()); tuned_env and tuning_table: a measured tuning for this node, its settings added to the env file and the table written beside it. InputError for bad input, OSError when the hints file cannot be read.
    """
def populate(data: typing_extensions.Buffer) -> None:
    """
    Faults the pages of `data` (a map_file array) in from the page cache, reading what is not cached, without copying them.
    """
def publish_directory(staged: str, target: str) -> bool:
    """
    Puts the synced folder `staged` in place of `target` in one step (a rename, or an exchange when target exists); True when it replaced one, whose old version `staged` then names. The parent folder is synced.
    """
def read_boot_id(proc_root: str = '/proc') -> str:
    """
    This boot's id (/proc/sys/kernel/random/boot_id), as PID 1 records it; '' when the kernel does not say.
    """
def route_to(address: str) -> tuple[str, str]:
    """
    (interface, source address) this host reaches `address` (an IP address) through, the kernel's choice for a connection to it (nothing is sent); with "", the default route's. OSError without a route (ENETUNREACH) or when the source address is on no interface.
    """
def scan_topology(sysfs_root: str = '/sys', expect_gpus: typing.SupportsInt | typing.SupportsIndex = -1, probe_bar0: bool = True) -> Topology:
    """
    Scans the PCI tree under sysfs_root. Raises OSError when it has no bus/pci/devices.
    """
def set_arguments_shown(arguments: collections.abc.Sequence[str]) -> int:
    """
    What ps and pkill -f read for this process: `arguments` (bytes, os.fsencode) after the program's name, over the command line it started with, cut where that line ends. Returns the bytes shown.
    """
def set_io_priority(priority: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Sets this process's IO priority (a value io_priority() gave).
    """
def supervise(command: collections.abc.Sequence[str], env: collections.abc.Mapping[str, str], grace_s: typing.SupportsFloat | typing.SupportsIndex = 10.0, on_signal: collections.abc.Callable | None = None, on_tick: collections.abc.Callable | None = None, tick_s: typing.SupportsFloat | typing.SupportsIndex = 0.0, on_log: collections.abc.Callable | None = None, parent_death_signal: typing.SupportsInt | typing.SupportsIndex = 0) -> int:
    """
    Runs command as pod-init's supervisor does: TERM, INT, HUP, USR1, USR2, QUIT and WINCH forwarded (on_signal(signum) for each, first: it returns False for a signal that is the caller's own, which no line then calls forwarded), every child reaped, KILL grace_s after a forwarded TERM or INT; on_tick() at least every tick_s. Block those signals in every thread first (signal.pthread_sigmask before starting threads). Returns the exit code: the status, 128+N for signal N, 127 not found, 126 not executable. parent_death_signal: sent to the command if this process dies, even by KILL. Words as bytes (os.fsencode) where they need not be UTF-8.
    """
def tuning_table_rules(text: str, source: str) -> tuple[str, int, int, list]:
    """
    A tuning table as the NCCL tuner plugin reads it: (nccl_version, ranks, nodes, rules), each rule (collective, min_bytes, max_bytes, algorithm, protocol, channels) in NCCL's numbering, -1/0 where NCCL chooses. InputError naming source for a table the plugin would refuse.
    """
CHECKSUM_ATTRIBUTE: str = 'user.pod-init.crc32c'
MAX_CHANNELS: int = 32
MAX_EXPECTED_GPUS: int = 4096
MAX_HOSTS: int = 65536
MAX_QUEUE_DEPTH: int = 4096
__version__: str = '0.1.0'
