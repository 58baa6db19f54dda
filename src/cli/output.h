// Human-readable output for the CLI: sizes, times, aligned tables and key/value blocks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::cli {

// 1536 -> "1.5 KiB", 512 -> "512 B", 10 << 30 -> "10 GiB".
std::string FormatSize(uint64_t bytes);
// "1.5 GiB (1610612736 bytes)"; plain "N bytes" under 1 KiB.
std::string FormatSizeExact(uint64_t bytes);
// "2024-05-01T12:34:56.123456+00:00" -> "2024-05-01 12:34:56"; anything else unchanged.
std::string FormatTime(std::string_view iso8601);
// Control characters (a newline in a file name, say) become '?' so one entry is one line.
std::string Printable(std::string_view s);
// Printable(s), appended to `out`.
void AppendPrintable(std::string& out, std::string_view s);

class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  // Columns whose cells are right-aligned (numbers).
  void AlignRight(size_t column);
  void AddRow(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }
  void Print(std::FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// "KEY    value" lines with the values aligned.
void PrintFields(std::FILE* out, const std::vector<std::pair<std::string, std::string>>& fields);

}  // namespace sluice::cli
