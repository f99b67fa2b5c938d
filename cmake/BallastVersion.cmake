# Stamps the version and git commit into one small generated source file.
# It is rewritten only when the commit changes, so a new commit relinks the
# binaries without recompiling anything else.
set(BALLAST_VERSION_CC ${CMAKE_BINARY_DIR}/gen/version_stamp.cc)
add_custom_target(ballast_version_stamp
  BYPRODUCTS ${BALLAST_VERSION_CC}
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DOUT=${BALLAST_VERSION_CC}
          -DVERSION=${PROJECT_VERSION} -P ${CMAKE_SOURCE_DIR}/cmake/write_version_stamp.cmake
  COMMENT "Stamping version")
