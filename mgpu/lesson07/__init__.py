"""Notebook 07's helpers (``notebooks/07_*.ipynb``).

- ``compression`` notebook 07's 2-bit packing, byte counts, training with per-tensor compressors
- ``saved``       the notebook's ``#@save`` cells (the 2-bit quantiser and all-reduce), written by ``mgpu.runtime.saved``
"""
