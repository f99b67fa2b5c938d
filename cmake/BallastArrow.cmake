# Apache Arrow and Parquet C++ come from the PyPI wheel `pyarrow` (see
# scripts/python-requirements.txt), as LibTorch comes from torch's. Only the
# trainer's data readers (worker/train/data/columnar_records.cc) link them.
#
# The wheel ships versioned libraries (libarrow.so.2600) and no unversioned
# names or CMake config, so the target links them by full path and the
# binaries find them through an RPATH into the wheel; nothing is written into
# site-packages.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import pyarrow, glob, os; d = pyarrow.get_library_dirs()[0]; print(pyarrow.get_include()); print(pyarrow.__version__); print(d); print(sorted(glob.glob(os.path.join(d, 'libarrow.so.*')))[0]); print(sorted(glob.glob(os.path.join(d, 'libparquet.so.*')))[0])"
  OUTPUT_VARIABLE _arrow_info RESULT_VARIABLE _arrow_rc ERROR_VARIABLE _arrow_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _arrow_rc EQUAL 0)
  message(FATAL_ERROR "The pyarrow wheel does not import with ${Python3_EXECUTABLE}, or ships no "
                      "libarrow/libparquet; run `make setup`.\n${_arrow_err}")
endif()
string(REPLACE "\n" ";" _arrow_info "${_arrow_info}")
list(GET _arrow_info 0 BALLAST_ARROW_INCLUDE)
list(GET _arrow_info 1 BALLAST_ARROW_VERSION)
list(GET _arrow_info 2 BALLAST_ARROW_LIBDIR)
list(GET _arrow_info 3 _arrow_lib)
list(GET _arrow_info 4 _parquet_lib)

# The wheel's std::string must be ours (the C++11 ABI, as torch's check in
# BallastTorch.cmake says): an old-ABI libarrow exports none of these.
file(STRINGS ${_arrow_lib} _arrow_cxx11 LIMIT_COUNT 1 REGEX "__cxx11")
if(NOT _arrow_cxx11)
  message(FATAL_ERROR "${_arrow_lib} was not built with the C++11 std::string ABI; "
                      "Debian's libraries and LibTorch use it.")
endif()
message(STATUS "Arrow ${BALLAST_ARROW_VERSION} from ${BALLAST_ARROW_LIBDIR}")

add_library(ballast_arrow INTERFACE)
add_library(ballast::arrow ALIAS ballast_arrow)
target_include_directories(ballast_arrow SYSTEM INTERFACE ${BALLAST_ARROW_INCLUDE})
target_link_libraries(ballast_arrow INTERFACE ${_parquet_lib} ${_arrow_lib})
# The binaries' RUNPATH names the wheel's folder (the build tree's and the
# installed ones: CMake's RPATH for a full-path library covers the build tree
# only). The worker image copies the two libraries beside LibTorch's.
target_link_options(ballast_arrow INTERFACE "LINKER:-rpath,${BALLAST_ARROW_LIBDIR}")
