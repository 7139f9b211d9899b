"""CPU fast paths: the weight layout and the AVX2 kernel (C++ source in csrc/)."""
