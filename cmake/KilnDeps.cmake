# Third-party libraries, all from Debian packages (scripts/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(nlohmann_json REQUIRED)
# CPU kernels: OpenBLAS (sgemm) and oneDNN (convolution), Debian's libopenblas-dev, libdnnl-dev.
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
find_package(dnnl CONFIG REQUIRED)
# Debian's oneDNN runs on OpenMP; kiln sets its thread count to ThreadPool's (conv_onednn.cc).
find_package(OpenMP REQUIRED)
find_package(FlatBuffers CONFIG REQUIRED)  # engine files (flatc + headers)
# mimalloc replaces malloc/free process-wide in the executables that link it (kiln_use_mimalloc).
if(KILN_MIMALLOC AND NOT KILN_BUILD_FUZZ)
  find_package(mimalloc 2.0 CONFIG REQUIRED)
endif()
