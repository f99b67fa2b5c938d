# Libraries from Debian's packages (see scripts/debian-packages.txt).
find_package(Threads REQUIRED)
find_package(Protobuf CONFIG QUIET)
if(NOT Protobuf_FOUND)
  find_package(Protobuf REQUIRED)
endif()
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
# SHA-256 and the CSPRNG for API tokens (server/authenticator.h).
find_package(OpenSSL REQUIRED)
find_package(PkgConfig REQUIRED)
# Boost.Beast and Asio serve HTTP (common/http_endpoint.h); header-only.
find_package(Boost 1.74 REQUIRED)
# cpp-httplib's client reads ballastd's HTTP port in its gtests and
# control_plane_bench; nothing installed links it.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET GLOBAL cpp-httplib)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET GLOBAL libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET GLOBAL libutf8proc)
# Training data read as .jsonl.zst (common/regular_file.h).
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET GLOBAL libzstd)
# ballastd --store postgresql://... (server/postgres_store.h).
pkg_check_modules(LIBPQ REQUIRED IMPORTED_TARGET GLOBAL libpq)
# The /metrics registry and its text format (Debian's 1.0.1; its config also finds
# civetweb, zlib and curl, which the -dev package pulls in).
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
find_program(PROTOC_PROGRAM protoc REQUIRED)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
