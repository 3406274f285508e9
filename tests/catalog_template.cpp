// The catalog template of one ctest run (tests/CMakeLists.txt, fixture `catalog_template`):
// migrated once, then copied by every test process that needs a catalog (tests/test_db.h).
//   catalog_template create NAME   (re)make it
//   catalog_template drop NAME     drop it and its roles
#include <iostream>
#include <string>

#include "tests/test_db.h"

int main(int argc, char** argv) {
  std::string command = argc == 3 ? argv[1] : "";
  if (command != "create" && command != "drop") {
    std::cerr << "usage: catalog_template create|drop NAME\n";
    return 2;
  }
  std::string name = argv[2];
  try {
    if (command == "create") {
      trnflow::testing::MakeCatalogTemplate(name);
      std::cout << "catalog template " << name << " migrated\n";
    } else {
      trnflow::testing::DropCatalog(name);
    }
  } catch (const std::exception& e) {
    std::cerr << "catalog_template " << command << " " << name << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
