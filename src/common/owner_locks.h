// Telling live processes from dead ones through the file system: each process holding a store
// keeps an exclusive flock(2) on a file of its own in a shared directory; the lock dies with the
// process (kill -9 included), so a lock that can be taken belongs to a process that is gone.
// Node-local state (the task history) uses it; several sluiced may share a state directory.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace sluice {

class OwnerLocks {
 public:
  // Creates `dir` when missing and a lock file for this process, held until destruction (a
  // clean destruction removes it: nothing is left to find).
  static Result<std::unique_ptr<OwnerLocks>> Open(std::string dir);
  ~OwnerLocks();

  const std::string& self() const { return self_; }
  // The owner ids with a file in the directory, this process's excluded.
  std::vector<std::string> Others() const;

  // Owner `id`'s process is gone when its lock can be taken or it has no file. While the
  // returned claim lives, the lock is held: the caller takes over the owner's records, then
  // calls Done to remove the file. nullopt: the owner is alive (or cannot be checked: another
  // user's file, out of descriptors; logged).
  struct Claim {
    UniqueFd fd;  // invalid when the owner had no file
    std::string file;
    void Done();  // the takeover is recorded: the owner's file goes
  };
  Result<std::optional<Claim>> ClaimIfGone(const std::string& id) const;

 private:
  OwnerLocks(std::string dir, std::string self, UniqueFd fd)
      : dir_(std::move(dir)), self_(std::move(self)), fd_(std::move(fd)) {}
  std::string dir_;
  std::string self_;
  UniqueFd fd_;
};

// Takes an exclusive flock on `path` (created when missing), waiting for it: serialises
// processes around a critical step. Held while the returned descriptor is open.
Result<UniqueFd> LockFileExclusive(const std::string& path);

// Moves the SQLite database `path` aside to `aside` with its write-ahead log, dropping its
// shared-memory file (a corrupt database, kept for inspection).
Status MoveDatabaseAside(const std::string& path, const std::string& aside);

}  // namespace sluice
