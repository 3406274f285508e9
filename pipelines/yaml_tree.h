#pragma once
// A YAML document as a flat, read-only tree, built from yaml-cpp's parser events.
//
// yaml-cpp's own YAML::Load builds a graph of reference-counted nodes (several allocations and
// shared pointers per node, a std::set of them per document) and tears it down the same way:
// for a 10,000-stage pipeline that was half the time of `trnflow submit`. The parser reads
// each value once and never changes the document, so it gets this instead: nodes in one
// vector, children by index, a node handle two words wide. Same scanner, same syntax errors
// (YAML::ParserException with its mark), same null and alias handling as YAML::Load.
#include <yaml-cpp/mark.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trnflow::pipelines {

class YamlDoc;

// A node of a YamlDoc, or an undefined one (a missing key). Cheap to copy; valid while its
// document lives.
class YamlNode {
 public:
  YamlNode() = default;

  bool IsDefined() const { return doc_ != nullptr; }
  explicit operator bool() const { return IsDefined(); }  // as yaml-cpp: a null value is defined
  bool IsNull() const;
  bool IsScalar() const;
  bool IsSequence() const;
  bool IsMap() const;
  const std::string& Scalar() const;  // empty unless a scalar
  YAML::Mark Mark() const;            // null for an undefined node
  size_t size() const;                // entries of a mapping, items of a list, else 0
  // The value of the first entry of a mapping whose key is the scalar `key`, else undefined.
  YamlNode operator[](std::string_view key) const;

  // Iterating a list yields its items; iterating a mapping yields entries whose `first` and
  // `second` are the key and the value (the item itself is then the key).
  class Item;
  class Iterator;
  Iterator begin() const;
  Iterator end() const;

 private:
  friend class YamlDoc;
  YamlNode(const YamlDoc* doc, uint32_t id) : doc_(doc), id_(id) {}
  const YamlDoc* doc_ = nullptr;
  uint32_t id_ = 0;
};

class YamlNode::Item : public YamlNode {
 public:
  YamlNode first, second;
  const Item* operator->() const { return this; }

 private:
  friend class Iterator;
  Item(YamlNode node, YamlNode key, YamlNode value) : YamlNode(node), first(key), second(value) {}
};

class YamlNode::Iterator {
 public:
  Item operator*() const;
  Item operator->() const { return **this; }
  Iterator& operator++() {
    pos_ += step_;
    return *this;
  }
  bool operator==(const Iterator& o) const { return pos_ == o.pos_; }
  bool operator!=(const Iterator& o) const { return pos_ != o.pos_; }

 private:
  friend class YamlNode;
  Iterator(const YamlDoc* doc, uint32_t pos, uint32_t step) : doc_(doc), pos_(pos), step_(step) {}
  const YamlDoc* doc_ = nullptr;
  uint32_t pos_ = 0, step_ = 1;
};

class YamlDoc {
 public:
  // Parses the first document of `text`; throws YAML::ParserException as YAML::Load does. An
  // empty text gives a null root.
  void Load(const std::string& text);
  YamlNode Root() const { return nodes_.empty() ? YamlNode() : YamlNode(this, 0); }

 private:
  friend class YamlNode;
  friend class YamlBuilder;
  enum class Kind : uint8_t { kNull, kScalar, kSequence, kMap };
  struct Node {
    Kind kind;
    YAML::Mark mark;
    uint32_t first = 0, count = 0;  // children in kids_ (a mapping's: key, value, key, ...)
    std::string scalar;
  };
  std::vector<Node> nodes_;
  std::vector<uint32_t> kids_;
};

}  // namespace trnflow::pipelines
