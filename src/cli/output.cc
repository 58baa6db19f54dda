#include "cli/output.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace sluice::cli {

namespace {

// Display width of UTF-8 text, counted in code points (close enough for names and sizes).
size_t Width(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

}  // namespace

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  // One decimal, dropped when it is zero: "1.5 GiB", "10 GiB".
  double rounded = std::round(v * 10.0) / 10.0;
  if (rounded >= 1024.0 && u + 1 < std::size(kUnits)) {
    rounded /= 1024.0;
    ++u;
  }
  if (rounded == std::floor(rounded)) return fmt::format("{:.0f} {}", rounded, kUnits[u]);
  return fmt::format("{:.1f} {}", rounded, kUnits[u]);
}

std::string FormatSizeExact(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  return fmt::format("{} ({} bytes)", FormatSize(bytes), bytes);
}

std::string FormatTime(std::string_view iso) {
  // YYYY-MM-DDTHH:MM:SS...
  if (iso.size() < 19 || iso[4] != '-' || iso[7] != '-' || iso[10] != 'T' || iso[13] != ':' ||
      iso[16] != ':')
    return std::string(iso);
  std::string out(iso.substr(0, 19));
  out[10] = ' ';
  return out;
}

void AppendPrintable(std::string& out, std::string_view s) {
  const size_t at = out.size();
  out.append(s);
  for (size_t i = at; i < out.size(); ++i)
    if (static_cast<unsigned char>(out[i]) < 0x20 || out[i] == 0x7f) out[i] = '?';
}

std::string Printable(std::string_view s) {
  std::string out;
  AppendPrintable(out, s);
  return out;
}

void Table::AlignRight(size_t column) {
  if (right_.size() <= column) right_.resize(column + 1, false);
  right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::FILE* out) const {
  std::vector<size_t> width(headers_.size(), 0);
  for (size_t i = 0; i < headers_.size(); ++i) width[i] = Width(headers_[i]);
  for (const auto& r : rows_)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], Width(r[i]));
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t i = 0; i < cells.size(); ++i) {
      bool last = i + 1 == cells.size();
      std::string pad(width[i] - Width(cells[i]), ' ');
      bool right = i < right_.size() && right_[i];
      if (right) s += pad;
      s += cells[i];
      if (!right && !last) s += pad;
      if (!last) s += "  ";
    }
    s += '\n';
    std::fputs(s.c_str(), out);
  };
  line(headers_);
  for (const auto& r : rows_) line(r);
}

void PrintFields(std::FILE* out, const std::vector<std::pair<std::string, std::string>>& fields) {
  size_t w = 0;
  for (const auto& [k, v] : fields) w = std::max(w, Width(k));
  for (const auto& [k, v] : fields)
    std::fputs(fmt::format("{}{}  {}\n", k, std::string(w - Width(k), ' '), v).c_str(), out);
}

}  // namespace sluice::cli
