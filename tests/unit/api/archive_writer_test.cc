// The TAR writer (POSIX pax, restricted) read back by libarchive's reader, which checks every
// header's checksum: names that fit ustar, split into its prefix, or need a pax header (long,
// non-ASCII, not UTF-8), long link targets, sizes past ustar's 8 GiB, nanosecond mtimes, the
// end-of-archive padding, and the misuse that would shift every later header.
#include "api/archive_writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/assert_status.h"

namespace sluice::api {
namespace {

struct ReadBack {
  std::string name, link, data;
  unsigned type = 0, perm = 0;
  int64_t size = 0, mtime_s = 0, mtime_ns = 0;
};

std::string Drain(ArchiveWriter& w) {
  std::string out(w.pending(), '\0');
  out.resize(w.Take(out.data(), out.size()));
  return out;
}

std::vector<ReadBack> Read(const std::string& tar) {
  std::vector<ReadBack> got;
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  EXPECT_EQ(archive_read_open_memory(a, tar.data(), tar.size()), ARCHIVE_OK);
  struct archive_entry* e;
  int rc;
  // ARCHIVE_WARN: a UTF-8 name this process's C locale cannot show; the raw name is kept.
  while ((rc = archive_read_next_header(a, &e)) == ARCHIVE_OK || rc == ARCHIVE_WARN) {
    ReadBack r;
    r.name = archive_entry_pathname(e);
    if (const char* l = archive_entry_symlink(e)) r.link = l;
    r.type = archive_entry_filetype(e);
    r.perm = archive_entry_perm(e);
    r.size = archive_entry_size(e);
    r.mtime_s = archive_entry_mtime(e);
    r.mtime_ns = archive_entry_mtime_nsec(e);
    char buf[4096];
    la_ssize_t n;
    while ((n = archive_read_data(a, buf, sizeof buf)) > 0) r.data.append(buf, n);
    EXPECT_GE(n, 0) << archive_error_string(a);
    got.push_back(std::move(r));
  }
  EXPECT_EQ(rc, ARCHIVE_EOF) << archive_error_string(a);
  archive_read_free(a);
  return got;
}

ArchiveWriter::Entry File(std::string name, std::string_view data, int64_t mtime = 1700000000) {
  ArchiveWriter::Entry e;
  e.name = std::move(name);
  e.size = data.size();
  e.mtime_s = mtime;
  return e;
}

Status AddFile(ArchiveWriter& w, ArchiveWriter::Entry e, std::string_view data) {
  SLUICE_RETURN_IF_ERROR(w.Header(e));
  SLUICE_RETURN_IF_ERROR(w.Data(data.data(), data.size()));
  return w.FinishEntry(e.name);
}

// How many pax extended headers ('x') a stream of plain ustar records holds.
int PaxHeaders(const std::string& tar) {
  int n = 0;
  for (size_t at = 0; at + 512 <= tar.size();) {
    const char* h = tar.data() + at;
    if (std::string_view(h, 512) == std::string(512, '\0')) break;
    uint64_t size = std::stoull(std::string(h + 124, 11), nullptr, 8);
    n += h[156] == 'x';
    at += 512 + (size + 511) / 512 * 512;
  }
  return n;
}

TEST(TarWriter, FilesDirectoriesAndLinksRoundTrip) {
  ArchiveWriter w(ArchiveWriter::Format::kTar, 0);
  ASSERT_TRUE(w.Open().ok());
  ASSERT_TRUE(AddFile(w, File("a/b.txt", "hello"), "hello").ok());
  ArchiveWriter::Entry d;
  d.name = "a";
  d.type = EntryType::kDirectory;
  d.perm = 0750;
  ASSERT_TRUE(w.Header(d).ok());
  ASSERT_TRUE(w.FinishEntry("a").ok());
  ArchiveWriter::Entry l;
  l.name = "a/link";
  l.type = EntryType::kSymlink;
  l.link = "b.txt";
  ASSERT_TRUE(w.Header(l).ok());
  ASSERT_TRUE(w.FinishEntry("a/link").ok());
  ASSERT_TRUE(AddFile(w, File("empty", ""), "").ok());
  std::string block(512, 'x');  // data that fills its last block exactly
  ASSERT_TRUE(AddFile(w, File("full", block), block).ok());
  ASSERT_TRUE(w.Close().ok());
  std::string tar = Drain(w);
  EXPECT_EQ(tar.size() % 512, 0u);
  EXPECT_EQ(PaxHeaders(tar), 0);
  auto got = Read(tar);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].name, "a/b.txt");
  EXPECT_EQ(got[0].data, "hello");
  EXPECT_EQ(got[0].type, unsigned(AE_IFREG));
  EXPECT_EQ(got[0].perm, 0644u);
  EXPECT_EQ(got[0].mtime_s, 1700000000);
  EXPECT_EQ(got[1].name, "a/");  // a directory's name ends in '/', as tar(1) writes it
  EXPECT_EQ(got[1].type, unsigned(AE_IFDIR));
  EXPECT_EQ(got[1].perm, 0750u);
  EXPECT_EQ(got[2].type, unsigned(AE_IFLNK));
  EXPECT_EQ(got[2].link, "b.txt");
  EXPECT_EQ(got[3].size, 0);
  EXPECT_EQ(got[4].data, block);
}

TEST(TarWriter, NamesPastUstarGoToPaxHeaders) {
  const std::string split = std::string(120, 'd') + "/" + std::string(90, 'f');  // prefix + name
  const std::string long_name = std::string(200, 'd') + "/" + std::string(120, 'f');
  const std::string korean = "데이터/파일.txt";
  const std::string binary =
      "bad\xff\xfe"
      "name";
  const std::string long_link = std::string(300, 't');
  ArchiveWriter w(ArchiveWriter::Format::kTar, 10240);
  ASSERT_TRUE(w.Open().ok());
  for (const auto& n : {split, long_name, korean, binary})
    ASSERT_TRUE(AddFile(w, File(n, n), n).ok()) << n;
  ArchiveWriter::Entry l;
  l.name = "l";
  l.type = EntryType::kSymlink;
  l.link = long_link;
  ASSERT_TRUE(w.Header(l).ok());
  ASSERT_TRUE(w.FinishEntry("l").ok());
  ASSERT_TRUE(w.Close().ok());
  std::string tar = Drain(w);
  EXPECT_EQ(tar.size() % 10240, 0u);  // the last block padded whole
  EXPECT_EQ(PaxHeaders(tar), 4);      // all but the name that splits into ustar's prefix
  EXPECT_NE(tar.find("hdrcharset=BINARY"), std::string::npos);
  auto got = Read(tar);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].name, split);
  EXPECT_EQ(got[1].name, long_name);
  EXPECT_EQ(got[1].data, long_name);
  EXPECT_EQ(got[2].name, korean);
  EXPECT_EQ(got[3].name, binary);
  EXPECT_EQ(got[4].link, long_link);
}

TEST(TarWriter, LargeSizesIdsAndTimes) {
  ArchiveWriter w(ArchiveWriter::Format::kTar, 0);
  ASSERT_TRUE(w.Open().ok());
  // A nanosecond mtime rides along only where a pax header is written anyway.
  auto plain = File("plain", "x");
  plain.mtime_ns = 5;
  ASSERT_TRUE(AddFile(w, plain, "x").ok());
  auto late = File("late", "y", 0x80000000LL);  // past 31 bits
  late.mtime_ns = 250000000;
  late.uid = 1u << 30;
  ASSERT_TRUE(AddFile(w, late, "y").ok());
  ASSERT_TRUE(w.Close().ok());
  auto got = Read(Drain(w));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].mtime_ns, 0);
  EXPECT_EQ(got[1].mtime_s, 0x80000000LL);
  EXPECT_EQ(got[1].mtime_ns, 250000000);

  // Before 1970: the pax value is signed decimal (-2 s + 0.5 s is -1.5 s). Before, it was
  // written "-2.500000000" (the wrong time) or, from a truncated split, "-1.-500000000", which
  // GNU tar refuses as a malformed header.
  ArchiveWriter old(ArchiveWriter::Format::kTar, 0);
  ASSERT_TRUE(old.Open().ok());
  auto early = File("early", "z", -2);
  early.mtime_ns = 500000000;
  ASSERT_TRUE(AddFile(old, early, "z").ok());
  ASSERT_TRUE(old.Close().ok());
  const std::string bytes = Drain(old);
  EXPECT_NE(bytes.find("mtime=-1.500000000\n"), std::string::npos);
  ASSERT_EQ(Read(bytes).size(), 1u);

  // 9 GB cannot be said in ustar's 11 octal digits.
  ArchiveWriter big(ArchiveWriter::Format::kTar, 0);
  ASSERT_TRUE(big.Open().ok());
  auto e = File("big", "");
  e.size = 9000000000ULL;
  ASSERT_TRUE(big.Header(e).ok());
  std::string head = Drain(big);
  EXPECT_NE(head.find("size=9000000000\n"), std::string::npos);
  EXPECT_EQ(PaxHeaders(head), 1);
}

TEST(TarWriter, RefusesWhatWouldShiftLaterHeaders) {
  ArchiveWriter w(ArchiveWriter::Format::kTar, 0);
  EXPECT_FALSE(w.Header(File("early", "")).ok());  // not open
  ASSERT_TRUE(w.Open().ok());
  auto e = File("f", "abc");
  ASSERT_TRUE(w.Header(e).ok());
  EXPECT_FALSE(w.Data("abcd", 4).ok());        // past the size
  EXPECT_FALSE(w.Header(File("g", "")).ok());  // inside f's data
  ASSERT_TRUE(w.Data("ab", 2).ok());
  EXPECT_FALSE(w.FinishEntry("f").ok());  // a byte short
  EXPECT_FALSE(w.Close().ok());
  ASSERT_TRUE(w.Data("c", 1).ok());
  ASSERT_TRUE(w.FinishEntry("f").ok());
  EXPECT_FALSE(w.Header(File(std::string("nu\0l", 4), "")).ok());
  ASSERT_TRUE(w.Close().ok());
  EXPECT_FALSE(w.Header(File("late", "")).ok());
  auto got = Read(Drain(w));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].data, "abc");
}

// libarchive 3.6 writes a ZIP entry's central-directory record into a fixed 64 KiB buffer
// unchecked: a name past it corrupted the heap. Refused before libarchive sees it, as written
// (an invalid byte becomes U+FFFD, three bytes); the archive goes on whole.
TEST(ZipWriter, RefusesNamesLongerThanAnEntryHolds) {
  ArchiveWriter w(ArchiveWriter::Format::kZip, 0);
  ASSERT_OK(w.Open());
  EXPECT_ERROR(w.Header(File(std::string(70000, 'a'), "")), Code::kInvalidArgument);
  EXPECT_ERROR(w.Header(File(std::string(kMaxZipEntryName / 3 + 1, '\xff'), "")),
               Code::kInvalidArgument);
  ASSERT_OK(AddFile(w, File(std::string(kMaxZipEntryName - 2, 'b'), "ok"), "ok"));
  ASSERT_OK(w.Close());
}

}  // namespace
}  // namespace sluice::api
