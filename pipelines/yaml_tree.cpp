#include "pipelines/yaml_tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <sstream>

namespace trnflow::pipelines {

// Appends the nodes of one document as the parser reports them. A container's children are
// gathered on a stack while it is open and moved into kids_ in one piece when it closes, so
// every container's children are contiguous without a vector per container.
class YamlBuilder : public YAML::EventHandler {
 public:
  explicit YamlBuilder(YamlDoc& doc) : doc_(doc) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Add(YamlDoc::Kind::kNull, mark, anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (anchor >= anchors_.size() || anchors_[anchor] == kNone)
      throw YAML::ParserException(mark, YAML::ErrorMsg::UNKNOWN_ANCHOR);
    open_.push_back(anchors_[anchor]);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string& value) override {
    doc_.nodes_[Add(YamlDoc::Kind::kScalar, mark, anchor)].scalar = value;
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Start(YamlDoc::Kind::kSequence, mark, anchor);
  }
  void OnSequenceEnd() override { End(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Start(YamlDoc::Kind::kMap, mark, anchor);
  }
  void OnMapEnd() override { End(); }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  uint32_t Add(YamlDoc::Kind kind, const YAML::Mark& mark, YAML::anchor_t anchor) {
    auto id = static_cast<uint32_t>(doc_.nodes_.size());
    doc_.nodes_.push_back({kind, mark, 0, 0, {}});
    if (anchor != YAML::NullAnchor) {
      if (anchor >= anchors_.size()) anchors_.resize(anchor + 1, kNone);
      anchors_[anchor] = id;
    }
    open_.push_back(id);  // a child of the open container (the root has none)
    return id;
  }
  void Start(YamlDoc::Kind kind, const YAML::Mark& mark, YAML::anchor_t anchor) {
    uint32_t id = Add(kind, mark, anchor);
    starts_.push_back({id, open_.size()});
  }
  void End() {
    auto [id, start] = starts_.back();
    starts_.pop_back();
    YamlDoc::Node& n = doc_.nodes_[id];
    n.first = static_cast<uint32_t>(doc_.kids_.size());
    n.count = static_cast<uint32_t>(open_.size() - start);
    doc_.kids_.insert(doc_.kids_.end(), open_.begin() + static_cast<std::ptrdiff_t>(start),
                      open_.end());
    open_.resize(start);
  }

  YamlDoc& doc_;
  std::vector<uint32_t> open_;                       // children of the open containers
  std::vector<std::pair<uint32_t, size_t>> starts_;  // open container, its first child in open_
  std::vector<uint32_t> anchors_;                    // anchor -> node
};

void YamlDoc::Load(const std::string& text) {
  nodes_.clear();
  kids_.clear();
  nodes_.reserve(text.size() / 16);  // about a node per line of a typical pipeline
  kids_.reserve(text.size() / 16);
  std::istringstream in(text);
  YAML::Parser parser(in);
  YamlBuilder builder(*this);
  parser.HandleNextDocument(builder);
}

bool YamlNode::IsNull() const { return doc_ && doc_->nodes_[id_].kind == YamlDoc::Kind::kNull; }
bool YamlNode::IsScalar() const {
  return doc_ && doc_->nodes_[id_].kind == YamlDoc::Kind::kScalar;
}
bool YamlNode::IsSequence() const {
  return doc_ && doc_->nodes_[id_].kind == YamlDoc::Kind::kSequence;
}
bool YamlNode::IsMap() const { return doc_ && doc_->nodes_[id_].kind == YamlDoc::Kind::kMap; }

const std::string& YamlNode::Scalar() const {
  static const std::string kEmpty;
  return IsScalar() ? doc_->nodes_[id_].scalar : kEmpty;
}

YAML::Mark YamlNode::Mark() const { return doc_ ? doc_->nodes_[id_].mark : YAML::Mark::null_mark(); }

size_t YamlNode::size() const {
  if (IsMap()) return doc_->nodes_[id_].count / 2;
  if (IsSequence()) return doc_->nodes_[id_].count;
  return 0;
}

YamlNode YamlNode::operator[](std::string_view key) const {
  if (!IsMap()) return {};
  const YamlDoc::Node& n = doc_->nodes_[id_];
  for (uint32_t i = n.first; i < n.first + n.count; i += 2) {
    const YamlDoc::Node& k = doc_->nodes_[doc_->kids_[i]];
    if (k.kind == YamlDoc::Kind::kScalar && k.scalar == key)
      return {doc_, doc_->kids_[i + 1]};
  }
  return {};
}

YamlNode::Iterator YamlNode::begin() const {
  if (!IsMap() && !IsSequence()) return {doc_, 0, 1};
  const YamlDoc::Node& n = doc_->nodes_[id_];
  return {doc_, n.first, IsMap() ? 2u : 1u};
}

YamlNode::Iterator YamlNode::end() const {
  if (!IsMap() && !IsSequence()) return {doc_, 0, 1};
  const YamlDoc::Node& n = doc_->nodes_[id_];
  return {doc_, n.first + n.count, IsMap() ? 2u : 1u};
}

YamlNode::Item YamlNode::Iterator::operator*() const {
  YamlNode node(doc_, doc_->kids_[pos_]);
  if (step_ == 2) return {node, node, YamlNode(doc_, doc_->kids_[pos_ + 1])};
  return {node, {}, {}};
}

}  // namespace trnflow::pipelines
