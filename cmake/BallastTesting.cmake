# Test registration. Every CTest name starts with its component
# (kernels., train., parity., guard., server., integration., ...), so one
# area runs with `ctest -R '^kernels\.'`.
enable_testing()
include(GoogleTest)

# ballast_gtest(name COMPONENT c [TORCH] SOURCES ... LIBS ... [FIXTURE f] [ENV ...]):
# one GoogleTest binary whose cases register as `c.Suite.Case`. A case that
# calls GTEST_SKIP (the GPU-only ones, without a device) is reported by CTest
# as skipped. Every case requires the CTest fixture `f`, if given, and gets
# the variables of ENV (NAME=VALUE) besides BALLAST_SOURCE_DIR.
# TORCH compiles the sources with the shared torch precompiled header; they go
# through a PIC object library because the header was built PIC, not PIE.
function(ballast_gtest name)
  cmake_parse_arguments(ARG "TORCH" "COMPONENT;FIXTURE" "SOURCES;LIBS;ENV" ${ARGN})
  if(ARG_TORCH)
    add_library(${name}_objs OBJECT ${ARG_SOURCES})
    target_link_libraries(${name}_objs PUBLIC ${ARG_LIBS} GTest::gtest GTest::gmock)
    target_precompile_headers(${name}_objs REUSE_FROM ballast_torch_pch)
    add_executable(${name})
    target_link_libraries(${name} PRIVATE ${name}_objs GTest::gtest_main)
  else()
    add_executable(${name} ${ARG_SOURCES})
    target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest_main GTest::gmock)
  endif()
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(_properties SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
                  ENVIRONMENT "BALLAST_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  if(ARG_FIXTURE)
    list(APPEND _properties FIXTURES_REQUIRED ${ARG_FIXTURE})
  endif()
  # One property per variable: a list's semicolons do not survive discovery.
  foreach(_variable IN LISTS ARG_ENV)
    string(REPLACE "=" "=set:" _modification "${_variable}")
    list(APPEND _properties ENVIRONMENT_MODIFICATION "${_modification}")
  endforeach()
  gtest_discover_tests(${name}
    TEST_PREFIX "${ARG_COMPONENT}."
    DISCOVERY_TIMEOUT 60
    PROPERTIES ${_properties})
endfunction()

# ballast_pytest(NAME ctest_name FILE path [ARGS ...]): one pytest file as one
# CTest test. Exit code 5 (nothing collected) is a failure, never a pass.
# HF5: runs under build/hf5/bin/python, the transformers 5.x reference venv
# that `make setup` makes (scripts/python-requirements-hf5.txt says why).
# WHOLE_MACHINE: a test of one long step that needs every core (make test
# gives each test nproc / JOBS threads): ctest runs it alone, with as many
# threads as the machine has cores.
function(ballast_pytest)
  cmake_parse_arguments(ARG "HF5;WHOLE_MACHINE;BUILDS" "NAME;FILE;TIMEOUT" "ARGS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 900)
  endif()
  set(_python ${Python3_EXECUTABLE})
  if(ARG_HF5)
    set(_python ${CMAKE_SOURCE_DIR}/build/hf5/bin/python)
  endif()
  add_test(NAME ${ARG_NAME}
           COMMAND ${_python} -m pytest -q -x -p no:cacheprovider
                   ${CMAKE_SOURCE_DIR}/${ARG_FILE} ${ARG_ARGS}
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(${ARG_NAME} PROPERTIES
    TIMEOUT ${ARG_TIMEOUT}
    SKIP_RETURN_CODE 77
    ENVIRONMENT "BALLAST_BIN_DIR=${CMAKE_BINARY_DIR}/bin;BALLAST_SOURCE_DIR=${CMAKE_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1")
  if(ARG_WHOLE_MACHINE)
    cmake_host_system_information(RESULT _cores QUERY NUMBER_OF_LOGICAL_CORES)
    set_tests_properties(${ARG_NAME} PROPERTIES RUN_SERIAL TRUE)
    set_property(TEST ${ARG_NAME} APPEND PROPERTY ENVIRONMENT "OMP_NUM_THREADS=${_cores}")
  endif()
  # A test that runs the build (the demo's build stage) runs alone: when the
  # version stamp has changed (a new commit, an edited tracked file), the
  # build relinks every binary, and for the seconds the linker writes one,
  # the tests beside it that exec it get EACCES.
  if(ARG_BUILDS)
    set_tests_properties(${ARG_NAME} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()
