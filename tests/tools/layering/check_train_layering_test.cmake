# cmake -DSOURCE_DIR=<repo> -P check_train_layering_test.cmake
#
# The layering check of worker/train (cmake/check_train_layering.cmake) on
# this folder, whose header includes io/ and model/. Checked as io/ with no
# DEPS it must fail and name the model/ include alone; checked with model in
# DEPS it must pass.
cmake_minimum_required(VERSION 3.25)
get_filename_component(_folder ${CMAKE_CURRENT_LIST_FILE} DIRECTORY)
set(_check ${SOURCE_DIR}/cmake/check_train_layering.cmake)

execute_process(
  COMMAND ${CMAKE_COMMAND} -DCOMPONENT=io -DFOLDER=${_folder} -DDEPS= -P ${_check}
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "io/ including model/ passed the check:\n${_out}")
endif()
if(NOT _out MATCHES "upward_include.h: #include \"worker/train/model/decoder.h\"")
  message(FATAL_ERROR "the failure does not name the include of model/:\n${_out}")
endif()
if(_out MATCHES "#include \"worker/train/io/")
  message(FATAL_ERROR "the failure names io/'s include of itself:\n${_out}")
endif()

execute_process(
  COMMAND ${CMAKE_COMMAND} -DCOMPONENT=io -DFOLDER=${_folder} -DDEPS=data,model -P ${_check}
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "an include of a component listed in DEPS failed the check:\n${_out}")
endif()
