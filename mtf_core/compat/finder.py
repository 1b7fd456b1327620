"""The import hook behind :mod:`mtf_core.compat`.

A meta-path finder answers for ``mesh_tensorflow`` and its submodules:

* the modules that make up Mesh TensorFlow's library (``ops``, ``layers``,
  ``placement_mesh_impl``, ...) are aliases: importing one returns the mtf_core
  module itself (``ALIASES``), so ``mock.patch.object`` on it patches the code
  that runs; a few are thin compat modules over mtf_core's (``layers``: the
  dense family named as Mesh TF names it, :mod:`mtf_core.compat.layers`);
* ``mesh_tensorflow`` itself is a package module whose attributes are
  mtf_core's and whose ``__path__`` holds the directories of Mesh TF's own
  model packages (``MESH_TF_PACKAGES``), which Python's path finder then loads
  unchanged;
* any other Mesh TF submodule (a TPU-only or private one) raises
  ``ModuleNotFoundError`` naming it, rather than loading half of Mesh TF.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

_ROOT = "mesh_tensorflow"

# Mesh TF module -> the mtf_core module that stands for it.
ALIASES: dict[str, str] = {
    "mesh_tensorflow.ops": "mtf_core",
    "mesh_tensorflow.ops_with_redefined_builtins": "mtf_core",
    "mesh_tensorflow.layers": "mtf_core.compat.layers",
    "mesh_tensorflow.optimize": "mtf_core.compat.optimize",
    "mesh_tensorflow.placement_mesh_impl": "mtf_core.lowering.placement",
    "mesh_tensorflow.simd_mesh_impl": "mtf_core.compat.simd_mesh_impl",
    "mesh_tensorflow.utils": "mtf_core.utils",
    "mesh_tensorflow.beam_search": "mtf_core.beam_search",
    "mesh_tensorflow.test_utils": "mtf_core.lowering.numpy_converter",
    "mesh_tensorflow.auto_mtf": "mtf_core.compat.auto_mtf",
    "mesh_tensorflow.auto_mtf.api": "mtf_core.compat.auto_mtf.api",
    "mesh_tensorflow.auto_mtf.graph_interface": (
        "mtf_core.compat.auto_mtf.graph_interface"
    ),
    "mesh_tensorflow.auto_mtf.memory_estimator": (
        "mtf_core.compat.auto_mtf.memory_estimator"
    ),
    "mesh_tensorflow.auto_mtf.scheduler": "mtf_core.compat.auto_mtf.scheduler",
    "mesh_tensorflow.auto_mtf.layout_optimizer": (
        "mtf_core.compat.auto_mtf.layout_optimizer"
    ),
    "mesh_tensorflow.auto_mtf.valid_layouts": "mtf_core.compat.auto_mtf.valid_layouts",
}

# Mesh TF's model code, loaded from its own files (never part of mtf_core).
MESH_TF_PACKAGES = ("transformer", "experimental", "bert")

# Submodules reachable as attributes of ``mesh_tensorflow`` without an import,
# as Mesh TF's ``__init__`` imports them.
_EAGER_SUBMODULES = (
    "beam_search",
    "layers",
    "optimize",
    "placement_mesh_impl",
    "simd_mesh_impl",
    "utils",
)

_extra_paths: list[str] = []


def add_mesh_tf_path(path: str | os.PathLike[str]) -> None:
    """Load Mesh TF's model packages (``transformer``, ...) from ``path``.

    ``path`` is a ``mesh_tensorflow`` directory, e.g. an unpacked
    mesh-tensorflow wheel's; only its ``MESH_TF_PACKAGES`` are used.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Mesh TF directory {path!r} does not exist")
    if path not in _extra_paths:
        _extra_paths.append(path)
    module = sys.modules.get(_ROOT)
    if isinstance(module, _MeshTfModule) and path not in module.__path__:
        module.__path__.append(path)


def _mesh_tf_paths() -> list[str]:
    """Where Mesh TF's own packages are: configured paths, then an installed
    mesh-tensorflow distribution."""
    paths = list(_extra_paths)
    env = os.environ.get("MTF_COMPAT_MESH_TF_PATH", "")
    paths += [p for p in env.split(os.pathsep) if p and p not in paths]
    spec = importlib.machinery.PathFinder.find_spec(_ROOT)
    if spec is not None and spec.submodule_search_locations:
        paths += [p for p in spec.submodule_search_locations if p not in paths]
    return paths


class _MeshTfModule(types.ModuleType):
    """``mesh_tensorflow``: mtf_core's names, and Mesh TF's model packages."""

    def __getattr__(self, name: str) -> Any:
        if name in _EAGER_SUBMODULES:
            return importlib.import_module(f"{_ROOT}.{name}")
        if name.startswith("__"):
            raise AttributeError(name)
        import mtf_core
        from mtf_core.compat import names

        if name in names.OVERRIDES:
            return names.OVERRIDES[name]
        try:
            return getattr(mtf_core, name)
        except AttributeError:
            if name in names.NAMES:
                return names.NAMES[name]
            raise AttributeError(
                f"module 'mesh_tensorflow' (mtf_core) has no attribute {name!r}"
            ) from None

    def __dir__(self) -> list[str]:
        import mtf_core

        return sorted(set(dir(mtf_core)) | set(self.__dict__))


class _RootLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _MeshTfModule(_ROOT, "Mesh TensorFlow's names, served by mtf_core.")
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = _mesh_tf_paths()
        module.ops = importlib.import_module("mtf_core")  # type: ignore[attr-defined]
        # As Mesh TF's __init__ does: its optimizers register with gin on import.
        importlib.import_module(f"{_ROOT}.optimize")


class _AliasLoader(importlib.abc.Loader):
    """Returns an existing mtf_core module under a Mesh TF name."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self._target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system stamped the alias's spec on the module; it keeps
        # its own, so reloading or pickling it still finds mtf_core's file.
        module.__spec__ = self._own_spec


class MeshTfFinder(importlib.abc.MetaPathFinder):
    """Resolves ``mesh_tensorflow`` names (see the module docstring)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == _ROOT:
            return importlib.machinery.ModuleSpec(
                fullname, _RootLoader(), is_package=True
            )
        if not fullname.startswith(_ROOT + "."):
            return None
        if fullname in ALIASES:
            target_name = ALIASES[fullname]
            own = importlib.util.find_spec(target_name)
            is_package = own is not None and own.submodule_search_locations is not None
            return importlib.machinery.ModuleSpec(
                fullname, _AliasLoader(target_name), is_package=is_package
            )
        parts = fullname.split(".")
        if parts[1] in MESH_TF_PACKAGES:
            return None  # Mesh TF's own code: Python's path finder loads it.
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: mtf_core.compat serves Mesh "
            f"TensorFlow's library modules {sorted(ALIASES)} and loads its "
            f"packages {list(MESH_TF_PACKAGES)}; {fullname!r} has no "
            "counterpart (see docs/compatibility.md)",
            name=fullname,
        )


_FINDER = MeshTfFinder()


def _tf_variable_scope() -> str:
    """TF's current variable scope name ('' if TensorFlow is not loaded)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return ""
    return str(tf.compat.v1.get_variable_scope().name)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent), and make
    variable names take TF's variable scope as a prefix, as Mesh TF's do (its
    Transformer names ``encoder/block_000/layer_000/SelfAttention/q`` so), and
    default weights come from TF's initializers as Mesh TF's do.
    :func:`uninstall` undoes all three."""
    from mtf_core.layers.initializers import set_initializer_provider
    from mtf_core.ops.variables import set_variable_scope_provider

    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    set_variable_scope_provider(_tf_variable_scope)
    set_initializer_provider(_mesh_tf_initializer)


def _mesh_tf_initializer(distribution: str, stddev: float) -> object:
    # Mesh TF's layers draw default weights with TensorFlow's initializers
    # (mtf_core's own draw with NumPy); TensorFlow loads on first use.
    from mtf_core.lowering.tf_initializers import mesh_tf_initializer

    return mesh_tf_initializer(distribution, stddev)


def uninstall() -> None:
    """Remove the finder, forget the ``mesh_tensorflow`` modules it made, and
    give variable names and default weights back to mtf_core's own rules."""
    from mtf_core.layers.initializers import set_initializer_provider
    from mtf_core.ops.variables import set_variable_scope_provider

    set_variable_scope_provider(None)
    set_initializer_provider(None)
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in list(sys.modules):
        if name == _ROOT or name.startswith(_ROOT + "."):
            del sys.modules[name]
