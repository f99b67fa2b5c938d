// A header that includes a component above its own: checked as part of io/, it
// must fail the layering check (cmake/check_train_layering.cmake), and checked
// as a component that lists model in its DEPS it must pass. Never compiled.
#ifndef BALLAST_TESTS_TOOLS_LAYERING_UPWARD_INCLUDE_H_
#define BALLAST_TESTS_TOOLS_LAYERING_UPWARD_INCLUDE_H_

#include "worker/train/io/mapped_file.h"
#include "worker/train/model/decoder.h"

#endif  // BALLAST_TESTS_TOOLS_LAYERING_UPWARD_INCLUDE_H_
