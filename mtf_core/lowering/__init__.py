"""Lowering mtf graphs to TensorFlow. Submodules import TensorFlow; this package\n__init__ does not, so TF-free code can use :mod:`mtf_core.lowering.lazy`."""
