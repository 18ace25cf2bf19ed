// The measured tuning table that `pyinit nccl --tune` writes and the tuner
// plugin reads: per collective and message-size range, the algorithm,
// protocol and channel count that beat NCCL's own choice on this kind of node.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pod_init {

// A choice NCCL is told to make; -1 / 0 leave that part to NCCL.
struct TunerChoice {
  int algorithm = -1;  // NCCL's algorithm numbering (tree 0, ring 1, ...)
  int protocol = -1;   // LL 0, LL128 1, Simple 2
  int channels = 0;
};

struct TunerRule {
  int collective = 0;  // NCCL's ncclFunc_t numbering
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;  // inclusive
  TunerChoice choice;
};

struct TuningTable {
  std::string nccl_version;  // "2.28.9": the NCCL the table was measured with
  int ranks = 0;             // the communicator it was measured on
  int nodes = 0;
  std::vector<TunerRule> rules;  // ranges of one collective never overlap
};

// Parses the table's JSON; InputError naming `source` for anything malformed
// or out of range (an unknown collective, algorithm or protocol; overlapping
// ranges), so a bad table is refused whole rather than half applied.
TuningTable parse_tuning_table(std::string_view text, const std::string& source);

// The rule for one call, or nullptr when the table says nothing about it.
const TunerRule* find_tuner_rule(const TuningTable& table, int collective, uint64_t bytes);

// "2.28.9" from ncclGetVersion()'s code (major*10000 + minor*100 + patch since 2.9).
std::string nccl_version_text(int code);

}  // namespace pod_init
