#include "common/json_reader.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "common/error.hpp"

namespace pod_init {

namespace {

const char* type_name(JsonValue::Type type) {
  switch (type) {
    case JsonValue::Type::Null:
      return "null";
    case JsonValue::Type::Bool:
      return "a boolean";
    case JsonValue::Type::Number:
      return "a number";
    case JsonValue::Type::String:
      return "a string";
    case JsonValue::Type::Array:
      return "an array";
    case JsonValue::Type::Object:
      return "an object";
  }
  return "?";
}

}  // namespace

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& source)
      : text_(text), source_(std::make_shared<const std::string>(source)) {}

  JsonValue document() {
    JsonValue value = parse(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) line += text_[i] == '\n';
    throw InputError(*source_, line, "malformed JSON: " + message);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool take(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  JsonValue parse(int depth) {
    if (depth > kMaxJsonDepth) fail("nested deeper than " + std::to_string(kMaxJsonDepth));
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    JsonValue value;
    value.source_ = source_;
    char c = text_[pos_];
    if (c == '{') {
      value.type_ = JsonValue::Type::Object;
      ++pos_;
      skip_space();
      if (take("}")) return value;
      do {
        skip_space();
        if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a member name");
        std::string key = string();
        skip_space();
        if (!take(":")) fail("expected ':' after a member name");
        value.object_[key] = parse(depth + 1);
        skip_space();
      } while (take(","));
      if (!take("}")) fail("expected ',' or '}'");
    } else if (c == '[') {
      value.type_ = JsonValue::Type::Array;
      ++pos_;
      skip_space();
      if (take("]")) return value;
      do {
        value.array_.push_back(parse(depth + 1));
        skip_space();
      } while (take(","));
      if (!take("]")) fail("expected ',' or ']'");
    } else if (c == '"') {
      value.type_ = JsonValue::Type::String;
      value.string_ = string();
    } else if (take("true")) {
      value.type_ = JsonValue::Type::Bool;
      value.bool_ = true;
    } else if (take("false")) {
      value.type_ = JsonValue::Type::Bool;
    } else if (take("null")) {
      value.type_ = JsonValue::Type::Null;
    } else {
      value.type_ = JsonValue::Type::Number;
      size_t end = pos_;
      while (end < text_.size() &&
             std::string_view("+-0123456789.eE").find(text_[end]) != std::string_view::npos)
        ++end;
      std::string digits(text_.substr(pos_, end - pos_));
      char* stop = nullptr;
      value.number_ = digits.empty() ? 0 : std::strtod(digits.c_str(), &stop);
      if (digits.empty() || *stop != '\0' || !std::isfinite(value.number_)) {
        fail("not a value");
      }
      pos_ = end;
    }
    return value;
  }

  // A string at pos_ (its opening quote), escapes decoded (\u as UTF-8).
  std::string string() {
    std::string out;
    ++pos_;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) break;
      char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) fail("short \\u escape");
          std::string hex(text_.substr(pos_, 4));
          char* stop = nullptr;
          unsigned long code = std::strtoul(hex.c_str(), &stop, 16);
          if (*stop != '\0') fail("bad \\u escape");
          pos_ += 4;
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default:
          fail(std::string("bad escape \\") + e);
      }
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::shared_ptr<const std::string> source_;
};

namespace {

[[noreturn]] void wrong_type(const std::shared_ptr<const std::string>& source, JsonValue::Type have,
                             const char* want) {
  throw InputError(source ? *source : "", 0,
                   std::string("expected ") + want + ", found " + type_name(have));
}

}  // namespace

bool JsonValue::boolean() const {
  if (type_ != Type::Bool) wrong_type(source_, type_, "a boolean");
  return bool_;
}

double JsonValue::number() const {
  if (type_ != Type::Number) wrong_type(source_, type_, "a number");
  return number_;
}

int64_t JsonValue::integer() const {
  double value = number();
  if (value != std::floor(value) || std::fabs(value) > 9.0e15) {
    wrong_type(source_, type_, "a whole number");
  }
  return static_cast<int64_t>(value);
}

const std::string& JsonValue::string() const {
  if (type_ != Type::String) wrong_type(source_, type_, "a string");
  return string_;
}

const std::vector<JsonValue>& JsonValue::array() const {
  if (type_ != Type::Array) wrong_type(source_, type_, "an array");
  return array_;
}

bool JsonValue::has(const std::string& key) const {
  return type_ == Type::Object && object_.count(key) != 0;
}

const JsonValue& JsonValue::operator[](const std::string& key) const {
  if (type_ != Type::Object) wrong_type(source_, type_, "an object");
  auto found = object_.find(key);
  if (found == object_.end()) {
    throw InputError(source_ ? *source_ : "", 0, "missing member '" + key + "'");
  }
  return found->second;
}

JsonValue parse_json(std::string_view text, const std::string& source) {
  return JsonParser(text, source).document();
}

}  // namespace pod_init
