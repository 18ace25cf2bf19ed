"""The loops of the data path that numpy cannot express as whole-array
operations: content hashing of records, grouping documents by shard, and the
seeded permutation of training windows.

Written in Cython's pure Python mode: the build compiles this file into an
extension module (which Python imports in preference to the source), and the
same source still runs as plain Python, which bench/data_loader.py uses to
measure what compiling buys. Arrays come in as typed memoryviews; the callers
in pyinit.data.shard_format and pyinit.data.dataset pass contiguous numpy arrays of the right
dtype. Arithmetic is masked to 64 bits so both modes give the same numbers.
"""

import cython
import numpy as np

# numpy's int64 is a C long on Linux x86-64 and aarch64, the only targets.
int32_t = cython.typedef(cython.int)
int64_t = cython.typedef(cython.long)
uint8_t = cython.typedef(cython.uchar)
uint32_t = cython.typedef(cython.uint)
uint64_t = cython.typedef(cython.ulonglong)
# Inputs may be read-only buffers (bytes, numpy views of them).
const_uint8_t = cython.typedef(cython.const[cython.uchar])
const_uint32_t = cython.typedef(cython.const[cython.uint])
const_int32_t = cython.typedef(cython.const[cython.int])
const_int64_t = cython.typedef(cython.const[cython.long])

# C constants when compiled; the masks then cost nothing and in plain Python
# they keep integers to 64 bits.
cython.declare(
    MASK64=uint64_t,
    MIX1=uint64_t,
    MIX2=uint64_t,
    FNV_OFFSET=uint64_t,
    FNV_PRIME=uint64_t,
    GOLDEN=uint64_t,
    FEISTEL_ROUNDS=cython.int,
)
MASK64 = 0xFFFFFFFFFFFFFFFF
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
GOLDEN = 0x9E3779B97F4A7C15
FEISTEL_ROUNDS = 4


@cython.ccall
@cython.exceptval(check=False)
def mix64(x: uint64_t) -> uint64_t:
    """splitmix64's finalizer: every input bit moves every output bit."""
    x = (x ^ (x >> 30)) * MIX1 & MASK64
    x = (x ^ (x >> 27)) * MIX2 & MASK64
    return x ^ (x >> 31)


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
def shard_of_records(data: const_uint8_t[::1], offsets: const_int64_t[::1], shard_count: int64_t):
    """Record i is data[offsets[i]:offsets[i + 1]] (UTF-8 text); its shard is
    mix64(FNV-1a-64(bytes)) % shard_count: the same on every machine."""
    count: int64_t = offsets.shape[0] - 1
    out = np.empty(count, dtype=np.int32)
    shard: int32_t[::1] = out
    i: int64_t
    j: int64_t
    h: uint64_t
    for i in range(count):
        h = FNV_OFFSET
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ data[j]) * FNV_PRIME & MASK64
        shard[i] = mix64(h) % shard_count
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def group_by_shard(
    tokens: const_uint32_t[::1],
    doc_offsets: const_int64_t[::1],
    shard_of: const_int32_t[::1],
    shard_count: int64_t,
    eot: int64_t,
):
    """Reorders documents by shard, keeping input order within a shard, and
    appends the end-of-text token to each when eot >= 0. Document i is
    tokens[doc_offsets[i]:doc_offsets[i + 1]]. Returns (grouped tokens,
    token_ends, doc_lengths, doc_ends): shard s holds grouped[token_ends[s]:
    token_ends[s + 1]] and documents doc_lengths[doc_ends[s]:doc_ends[s + 1]]."""
    docs: int64_t = doc_offsets.shape[0] - 1
    extra: int64_t = 1 if eot >= 0 else 0
    token_ends_array = np.zeros(shard_count + 1, dtype=np.int64)
    doc_ends_array = np.zeros(shard_count + 1, dtype=np.int64)
    token_ends: int64_t[::1] = token_ends_array
    doc_ends: int64_t[::1] = doc_ends_array
    i: int64_t
    s: int64_t
    length: int64_t
    for i in range(docs):
        s = shard_of[i]
        token_ends[s + 1] += doc_offsets[i + 1] - doc_offsets[i] + extra
        doc_ends[s + 1] += 1
    for s in range(shard_count):
        token_ends[s + 1] += token_ends[s]
        doc_ends[s + 1] += doc_ends[s]
    grouped_array = np.empty(token_ends[shard_count], dtype=np.uint32)
    lengths_array = np.empty(docs, dtype=np.int64)
    grouped: uint32_t[::1] = grouped_array
    lengths: int64_t[::1] = lengths_array
    token_at_array = token_ends_array[:shard_count].copy()
    doc_at_array = doc_ends_array[:shard_count].copy()
    token_at: int64_t[::1] = token_at_array
    doc_at: int64_t[::1] = doc_at_array
    for i in range(docs):
        s = shard_of[i]
        length = doc_offsets[i + 1] - doc_offsets[i]
        grouped[token_at[s] : token_at[s] + length] = tokens[doc_offsets[i] : doc_offsets[i + 1]]
        token_at[s] += length
        if extra:
            grouped[token_at[s]] = eot
            token_at[s] += 1
        lengths[doc_at[s]] = length + extra
        doc_at[s] += 1
    return grouped_array, token_ends_array, lengths_array, doc_ends_array


@cython.cfunc
@cython.exceptval(check=False)
def _feistel(x: uint64_t, half_bits: uint64_t, key: uint64_t) -> uint64_t:
    mask: uint64_t = (1 << half_bits) - 1
    left: uint64_t = x >> half_bits
    right: uint64_t = x & mask
    r: uint64_t
    for r in range(FEISTEL_ROUNDS):
        left, right = right, left ^ (mix64(right ^ (key + r * GOLDEN & MASK64)) & mask)
    return left << half_bits | right


@cython.boundscheck(False)
@cython.wraparound(False)
def permuted_windows(
    positions: const_int64_t[::1],
    window_count: int64_t,
    key: uint64_t,
    shard_ends: const_int64_t[::1],
):
    """The windows at the given positions of one epoch's order: a seeded
    permutation of 0..window_count-1 (a Feistel network, walked until it lands
    inside the range), computed per position, so a rank or worker works out
    only its own windows, in any order, with no table of them all. Returns
    (shard index, window index within the shard) for each position; shard s
    holds the global windows shard_ends[s] up to shard_ends[s + 1]."""
    count: int64_t = positions.shape[0]
    shard_array = np.empty(count, dtype=np.int64)
    local_array = np.empty(count, dtype=np.int64)
    shard: int64_t[::1] = shard_array
    local: int64_t[::1] = local_array
    half_bits: uint64_t = 1
    while (1 << (2 * half_bits)) < window_count:
        half_bits += 1
    shards: int64_t = shard_ends.shape[0] - 1
    i: int64_t
    lo: int64_t
    hi: int64_t
    mid: int64_t
    window: uint64_t
    for i in range(count):
        window = _feistel(positions[i], half_bits, key)
        while window >= window_count:
            window = _feistel(window, half_bits, key)
        lo = 0
        hi = shards - 1
        while lo < hi:  # the last shard whose first window is <= window
            mid = (lo + hi + 1) // 2
            if shard_ends[mid] <= window:
                lo = mid
            else:
                hi = mid - 1
        shard[i] = lo
        local[i] = window - shard_ends[lo]
    return shard_array, local_array
