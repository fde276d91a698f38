// Shared by the GPU tests: skip with the reason when this machine has no usable GPU.
#pragma once

#include <gtest/gtest.h>

#include "runtime/device.hpp"

#define TESSERA_REQUIRE_GPU()                                                         \
  do {                                                                                \
    if (::tessera::runtime::device_count() == 0)                                      \
      GTEST_SKIP() << "GPU test skipped: " << ::tessera::runtime::no_gpu_reason();    \
  } while (0)
