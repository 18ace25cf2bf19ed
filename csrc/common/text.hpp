// Text from files we do not control (sysfs attributes, hints, hostfiles) may
// hold any bytes. Before it reaches a terminal, a message or a JSON document
// it is made safe here, once: valid UTF-8 passes, every other byte and every
// control character is shown as \xNN.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pod_init {

// The length of the valid UTF-8 sequence at text[at], 0 when there is none.
size_t utf8_sequence(std::string_view text, size_t at);

// `text` with invalid UTF-8 and control characters (tab and newline too) as \xNN.
std::string printable(std::string_view text);

// The non-empty pieces of `text` between `separator`s ("a,,b" -> a, b).
std::vector<std::string> split_on(std::string_view text, char separator);

}  // namespace pod_init
