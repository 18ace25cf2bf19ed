#include "nccl/tuner/tuning_table.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "common/error.hpp"
#include "common/json_reader.hpp"

namespace pod_init {
namespace {

// Names as the table (and NCCL_ALGO / NCCL_PROTO, lower-cased) spell them, in
// NCCL's numbering.
constexpr std::array<std::string_view, 5> kCollectives = {"broadcast", "reduce", "allgather",
                                                          "reducescatter", "allreduce"};
constexpr std::array<std::string_view, 7> kAlgorithms = {
    "tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
constexpr std::array<std::string_view, 3> kProtocols = {"ll", "ll128", "simple"};
constexpr int kTableFormat = 1;
constexpr int64_t kMaxChannels = 64;  // NCCL's MAXCHANNELS
// Far past any communicator; the bound keeps a hostile number from wrapping to a real one.
constexpr int64_t kMaxRanks = int64_t{1} << 24;

template <size_t N>
int index_of(const std::array<std::string_view, N>& names, const JsonValue& value, const char* what,
             const std::string& source) {
  const std::string& name = value.string();
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  throw InputError(source, 0, std::string("unknown ") + what + " '" + name + "'");
}

// An optional member: null or absent leaves the choice to NCCL.
template <size_t N>
int optional_index(const JsonValue& rule, const char* key,
                   const std::array<std::string_view, N>& names, const std::string& source) {
  if (!rule.has(key) || rule[key].is_null()) return -1;
  return index_of(names, rule[key], key, source);
}

}  // namespace

TuningTable parse_tuning_table(std::string_view text, const std::string& source) {
  const JsonValue doc = parse_json(text, source);
  if (doc["format"].integer() != kTableFormat) {
    throw InputError(source, 0,
                     "table format " + std::to_string(doc["format"].integer()) +
                         ", this plugin reads format " + std::to_string(kTableFormat));
  }
  TuningTable table;
  const JsonValue& key = doc["key"];
  table.nccl_version = key["nccl_version"].string();
  // Checked as read, before the narrowing: 4294967298 ranks must not become 2.
  const int64_t ranks = doc["ranks"].integer();
  const int64_t nodes = doc["nodes"].integer();
  if (ranks < 1 || ranks > kMaxRanks || nodes < 1 || nodes > ranks) {
    throw InputError(source, 0,
                     "ranks must be from 1 to " + std::to_string(kMaxRanks) +
                         " and nodes from 1 to ranks, not " + std::to_string(ranks) + " and " +
                         std::to_string(nodes));
  }
  table.ranks = static_cast<int>(ranks);
  table.nodes = static_cast<int>(nodes);
  for (const JsonValue& raw : doc["rules"].array()) {
    TunerRule rule;
    rule.collective = index_of(kCollectives, raw["collective"], "collective", source);
    const int64_t min_bytes = raw["min_bytes"].integer();
    const int64_t max_bytes = raw["max_bytes"].integer();
    if (min_bytes < 0 || max_bytes < min_bytes) {
      throw InputError(source, 0,
                       "rule range " + std::to_string(min_bytes) + ".." +
                           std::to_string(max_bytes) + " is empty or negative");
    }
    rule.min_bytes = static_cast<uint64_t>(min_bytes);
    rule.max_bytes = static_cast<uint64_t>(max_bytes);
    rule.choice.algorithm = optional_index(raw, "algorithm", kAlgorithms, source);
    rule.choice.protocol = optional_index(raw, "protocol", kProtocols, source);
    // NCCL takes an algorithm and a protocol together or neither.
    if ((rule.choice.algorithm < 0) != (rule.choice.protocol < 0)) {
      throw InputError(source, 0, "a rule names both algorithm and protocol, or neither");
    }
    const int64_t channels = raw.has("channels") ? raw["channels"].integer() : 0;
    if (channels < 0 || channels > kMaxChannels) {
      throw InputError(source, 0, "channels " + std::to_string(channels) + " outside 0..64");
    }
    rule.choice.channels = static_cast<int>(channels);
    table.rules.push_back(rule);
  }
  std::sort(table.rules.begin(), table.rules.end(), [](const TunerRule& a, const TunerRule& b) {
    return a.collective != b.collective ? a.collective < b.collective : a.min_bytes < b.min_bytes;
  });
  for (size_t i = 1; i < table.rules.size(); ++i) {
    const TunerRule& before = table.rules[i - 1];
    const TunerRule& rule = table.rules[i];
    if (before.collective == rule.collective && rule.min_bytes <= before.max_bytes) {
      throw InputError(source, 0,
                       std::string(kCollectives[static_cast<size_t>(rule.collective)]) +
                           " ranges overlap at " + std::to_string(rule.min_bytes) + " bytes");
    }
  }
  return table;
}

const TunerRule* find_tuner_rule(const TuningTable& table, int collective, uint64_t bytes) {
  // The rules are sorted by (collective, min_bytes) and never overlap: the
  // candidate is the last one starting at or below the call, found in
  // O(log n), so a call costs the same for a table of any size.
  auto after =
      std::upper_bound(table.rules.begin(), table.rules.end(), std::make_pair(collective, bytes),
                       [](const std::pair<int, uint64_t>& call, const TunerRule& rule) {
                         return call.first != rule.collective ? call.first < rule.collective
                                                              : call.second < rule.min_bytes;
                       });
  if (after == table.rules.begin()) return nullptr;
  const TunerRule& rule = *(after - 1);
  return rule.collective == collective && bytes <= rule.max_bytes ? &rule : nullptr;
}

std::string nccl_version_text(int code) {
  if (code >= 20900) {
    return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
           std::to_string(code % 100);
  }
  // Before 2.9 NCCL packed the version as major*1000 + minor*100 + patch.
  return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 100) + "." +
         std::to_string(code % 100);
}

}  // namespace pod_init
