// `tessera`: verify, benchmark and profile the operators on the local GPU. All logic is in
// tessera_cli_lib (tools/cli.cpp, tools/commands.cpp) so the tests can drive it.
#include "cli.hpp"

int main(int argc, char** argv) { return tessera::cli::run_cli(argc, argv); }
