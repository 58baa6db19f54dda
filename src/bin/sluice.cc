// sluice: the command-line client for a running sluiced (manager-facing API).
#include "cli/commands.h"
#include "common/temp_files.h"

int main(int argc, char** argv) {
  // Before any thread: an interrupted download leaves no temporary file behind.
  sluice::temp_files::RemoveOnSignals();
  return sluice::cli::RunCli(argc, argv);
}
