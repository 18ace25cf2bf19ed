// A small JSON reader for pod-init's own documents (the topology JSON that PID 1
// leaves for the supervisor): objects, arrays, strings, numbers, true, false,
// null. Nesting is bounded, so a hostile file cannot exhaust the stack.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pod_init {

class JsonValue {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  // Each accessor throws InputError (naming the document) when the type differs.
  bool boolean() const;
  double number() const;
  int64_t integer() const;  // a number that is a whole value
  const std::string& string() const;
  const std::vector<JsonValue>& array() const;
  // The member `key` of an object; InputError when it is missing.
  const JsonValue& operator[](const std::string& key) const;
  bool has(const std::string& key) const;

 private:
  friend class JsonParser;
  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::map<std::string, JsonValue> object_;
  std::shared_ptr<const std::string> source_;  // the document's name, for errors
};

inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; InputError naming `source` and the line on malformed JSON.
JsonValue parse_json(std::string_view text, const std::string& source);

}  // namespace pod_init
