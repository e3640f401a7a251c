# Third-party libraries, all from Debian packages (scripts/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(nlohmann_json REQUIRED)
find_package(FlatBuffers CONFIG REQUIRED)  # engine files (flatc + headers)
