"""Mesh TensorFlow's own test suite, run on mtf_core (``make conformance``).

``python -m conformance`` downloads the mesh-tensorflow 0.1.21 wheel from
PyPI, unpacks its tests and its ``transformer``/``experimental`` packages into
a cache directory (never into the repository) and runs each test file, as its
own ``__main__``, in a subprocess where ``mesh_tensorflow`` resolves to
mtf_core (:mod:`mtf_core.compat`).  See docs/compatibility.md.
"""
