// sluice: the command-line client for a running sluiced (manager-facing API).
#include "cli/commands.h"

int main(int argc, char** argv) {
  return sluice::cli::RunCli(argc, argv);
}
