// ballast_spec_table README.md: rewrites the README's job spec table from
// the spec rules (common/spec_rules.h), which are its only source. Without
// an argument it prints the table.
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/status/statusor.h"
#include "common/spec_rules.h"

int main(int argc, char** argv) {
  if (argc == 1) {
    std::cout << ballast::SpecTableMarkdown();
    return 0;
  }
  if (argc != 2) {
    std::cerr << "usage: ballast_spec_table [README.md]\n";
    return 2;
  }
  std::stringstream text;
  text << std::ifstream(argv[1]).rdbuf();
  absl::StatusOr<std::string> updated = ballast::WithSpecTable(text.str());
  if (!updated.ok()) {
    std::cerr << "ballast_spec_table: " << argv[1] << ": " << updated.status().message() << "\n";
    return 2;
  }
  std::ofstream(argv[1]) << *updated;
  return 0;
}
