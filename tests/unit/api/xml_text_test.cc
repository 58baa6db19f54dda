// The listing's XML text writer against pugixml's, which it replaces on that path: the same
// bytes for every input.
#include "api/s3/xml_text.h"

#include <gtest/gtest.h>
#include <pugixml.hpp>

#include <random>

namespace sluice::api::s3 {
namespace {

std::string ViaPugi(const std::string& text) {
  pugi::xml_document doc;
  doc.append_child("K").text().set(text.c_str());
  struct Writer : pugi::xml_writer {
    std::string out;
    void write(const void* data, size_t size) override {
      out.append(static_cast<const char*>(data), size);
    }
  } w;
  doc.save(w, "", pugi::format_raw | pugi::format_no_declaration);
  return w.out;
}

std::string Direct(const std::string& text) {
  std::string out;
  AppendXmlElement(out, "K", text);
  return out;
}

TEST(XmlText, SameBytesAsPugixml) {
  std::string every;
  for (int c = 1; c < 256; ++c) every.push_back(static_cast<char>(c));
  EXPECT_EQ(Direct(every), ViaPugi(every));
  EXPECT_EQ(Direct(""), ViaPugi(""));
  EXPECT_EQ(Direct("a&b<c>d\"e'f\x01g\th"), "<K>a&amp;b&lt;c&gt;d\"e'f&#01;g\th</K>");
  // A NUL (a %00 in a listing's prefix or marker) ends the text, as it did through pugixml.
  const std::string with_nul("ab\0cd", 5);
  EXPECT_EQ(Direct(with_nul), ViaPugi(with_nul));
  EXPECT_EQ(Direct(with_nul), "<K>ab</K>");
  std::mt19937 rng(7);
  const std::string alphabet = "ab/&<>\"'\t\n\r\x01\x1f\x7f\xc3\xa9 ";
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 40, 'x');
    for (auto& c : s) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(Direct(s), ViaPugi(s)) << s;
  }
}

}  // namespace
}  // namespace sluice::api::s3
