"""Numba kernels: arrays in, arrays out. Nothing here imports beyond numpy, numba, math."""
