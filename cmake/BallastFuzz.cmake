# The fuzz build (BALLAST_FUZZ): every translation unit gets libFuzzer's
# coverage hooks, AddressSanitizer and UndefinedBehaviorSanitizer, so a
# crash, an out-of-bounds read or undefined behaviour in the code under test
# stops the run with the input that caused it. The fuzz targets themselves
# link libFuzzer's main (tests/fuzz/CMakeLists.txt).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "BALLAST_FUZZ needs clang's libFuzzer; configure with "
                      "CC=clang-14 CXX=clang++-14 (make fuzz does)")
endif()
add_compile_options(-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined
                    -fno-omit-frame-pointer)
add_link_options(-fsanitize=address,undefined)
