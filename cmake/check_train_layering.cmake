# cmake -DCOMPONENT=<name> -DFOLDER=<dir> -DDEPS=<a,b,...> [-DSTAMP=<file>] -P check_train_layering.cmake
#
# The layering check of worker/train/ (worker/train/CMakeLists.txt runs it
# before each component's library builds). Every #include of
# worker/train/<folder>/ in FOLDER's *.h and *.cc must name COMPONENT itself or
# one of DEPS, the components its library links; anything else is an include
# that goes back up (or sideways) in the layering, and fails with the file and
# the include. Includes that climb out of the folder with ".." are refused, as
# they would escape the check. On success it touches STAMP.
cmake_minimum_required(VERSION 3.25)
foreach(_arg COMPONENT FOLDER)
  if(NOT DEFINED ${_arg})
    message(FATAL_ERROR "check_train_layering.cmake: -D${_arg}= is required")
  endif()
endforeach()
string(REPLACE "," ";" _allowed "${DEPS}")
list(APPEND _allowed ${COMPONENT})

file(GLOB _files ${FOLDER}/*.h ${FOLDER}/*.cc)
list(SORT _files)
set(_wrong "")
foreach(_file IN LISTS _files)
  file(STRINGS ${_file} _includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(_line IN LISTS _includes)
    string(STRIP "${_line}" _line)
    if(_line MATCHES "[\"<]worker/train/([A-Za-z0-9_]+)/")
      if(NOT CMAKE_MATCH_1 IN_LIST _allowed)
        string(APPEND _wrong "\n  ${_file}: ${_line}")
      endif()
    elseif(_line MATCHES "[\"<]\\.\\./")
      string(APPEND _wrong "\n  ${_file}: ${_line} (name it from the source root)")
    endif()
  endforeach()
endforeach()

if(_wrong)
  if(DEPS STREQUAL "")
    set(_deps "no component")
  else()
    string(REPLACE "," " " _deps "${DEPS}")
  endif()
  message(FATAL_ERROR
    "worker/train/${COMPONENT}/ includes components outside its DEPS (${_deps}):${_wrong}\n"
    "A component includes only itself and the components below it that it lists in DEPS "
    "(worker/train/CMakeLists.txt). Move the type down, or list the component if it is below "
    "this one.")
endif()
if(DEFINED STAMP)
  file(TOUCH ${STAMP})
endif()
