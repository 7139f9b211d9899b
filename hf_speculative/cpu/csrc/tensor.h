// What the kernel's compute files need of torch: tensors, their methods and the parallel loop, without
// torch/extension.h (pybind11 and the whole C++ API): parsing that header is most of a file's compile time (about 30
// of 35 s a file on a 2-core machine beside a test run), paid once per file per venv. Only the files that define the
// Python module's functions (skinny_linear.cpp, decoder_layer.cpp) include it.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
