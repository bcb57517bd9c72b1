"""HashRec: a recommendation trainer with collision-free dynamic embedding tables."""

__version__ = "0.1.0"
