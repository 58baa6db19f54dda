// A directory of small named records (JSON text) that several sluiced nodes share through the
// file system they all mount: one file per record, replaced atomically (written aside, fsync,
// rename) and created exclusively (link), so concurrent writers on any node never tear a record
// or lose one, and a reader sees the old record or the new one.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sluice {

class RecordDir {
 public:
  // Opens `path`, creating it (and its parents) when missing.
  static Result<RecordDir> Open(std::string path);

  const std::string& path() const { return path_; }
  // nullopt when there is no such record.
  Result<std::optional<std::string>> Get(std::string_view name) const;
  // kAlreadyExists when the record exists (on any node).
  Status Create(std::string_view name, std::string_view body) const;
  Status Put(std::string_view name, std::string_view body) const;
  // kNotFound when there is no such record.
  Status Remove(std::string_view name) const;
  // Every record's name, unordered.
  Result<std::vector<std::string>> List() const;
  // What changes whenever a record is created, replaced or removed (the directory's change
  // time): lets readers reload only when something changed. "" while the directory changed
  // less than two seconds ago: file system clocks tick coarsely (a jiffy), so a second change
  // in the same tick would leave the stamp as it was, and go unseen by whoever kept it.
  Result<std::string> Stamp() const;

  // Record names: 1-255 bytes, no '/', no NUL, not starting with '.'.
  static Status CheckName(std::string_view name);

 private:
  explicit RecordDir(std::string path) : path_(std::move(path)) {}
  std::string FileOf(std::string_view name) const;
  // Writes `body` to a new private file beside the records; returns its path.
  Result<std::string> WriteAside(std::string_view body) const;

  std::string path_;
};

}  // namespace sluice
