"""harvest's version, in a module of its own at the bottom layer: every layer may read it without
importing the package's top (``harvest/__init__.py``, which reaches up to the Python API)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
