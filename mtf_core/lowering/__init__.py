"""Lowering mtf graphs to TensorFlow.  Submodules import TensorFlow; this
package's ``__init__`` does not."""
