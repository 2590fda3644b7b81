"""Notebook 07's helpers (``notebooks/07_*.ipynb``).

- ``costs``       collectives timed on Horovod, the alpha-beta fit and the ring's formula, tensor fusion counted in
                  the timeline, overlap of the all-reduce with the backward pass on the simulated accelerator
- ``compression`` notebook 07's 2-bit packing, byte counts, training with per-tensor compressors
- ``figures``     the notebook's figures, one call each
- ``saved``       the notebook's ``#@save`` cells (the 2-bit quantiser and all-reduce), written by ``mgpu.runtime.saved``
"""
