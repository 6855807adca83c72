"""Backends implementing the op table: NumPy (reference, CPU) and CUDA (CuPy RawKernels)."""
