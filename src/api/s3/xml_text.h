// XML text written straight into a string, for the listing answers: a page of 1,000 keys built
// as a pugixml document cost more than reading the directory it lists (7,000 nodes, then
// serialised). Escapes exactly as pugixml's writer does, so answers are byte for byte what they
// were (tests/unit/api/xml_text_test.cc compares the two): & < > as entities, control bytes
// other than tab, LF and CR as "&#NN;", everything else (UTF-8 included) as it is; a NUL ends
// the text.
#pragma once

#include <string>
#include <string_view>

namespace sluice::api::s3 {

inline void AppendXmlText(std::string& out, std::string_view s) {
  // A NUL ends the text, as it did when pugixml took it as a C string (XML has no NUL).
  s = s.substr(0, s.find('\0'));
  size_t run = 0;  // bytes that need no escape go in one append
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 ? c != '&' && c != '<' && c != '>' : c == '\t' || c == '\n' || c == '\r')
      continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else {
      const char ent[] = {'&', '#', static_cast<char>('0' + c / 10),
                          static_cast<char>('0' + c % 10), ';'};
      out.append(ent, sizeof ent);
    }
  }
  out.append(s.data() + run, s.size() - run);
}

// <name>text</name>
inline void AppendXmlElement(std::string& out, std::string_view name, std::string_view text) {
  out.append("<").append(name).append(">");
  AppendXmlText(out, text);
  out.append("</").append(name).append(">");
}

}  // namespace sluice::api::s3
