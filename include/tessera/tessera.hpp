// Umbrella header: the whole public C++ API.
#pragma once

#include "tessera/error.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/attention.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/loss.hpp"
#include "tessera/ops/matrix.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/rowwise.hpp"
#include "tessera/ops/set.hpp"
#include "tessera/tensor.hpp"
#include "tessera/tune.hpp"
#include "tessera/version.hpp"
