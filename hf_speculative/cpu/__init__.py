"""CPU fast paths: the weight layout and the AVX2/AVX-512 kernel (C++ source in csrc/)."""
