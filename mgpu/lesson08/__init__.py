"""Notebook 08's helpers (``notebooks/08_*.ipynb``).

- ``figures`` the notebook's figures, one call each (saved to ``build/figures/``)
- ``memory``  the parts of a training step's memory measured from the tensors; the recomputation study
  (TensorFlow's allocator, bytes held and peak, time)
- ``zero``    the ZeRO harness: each stage trained from the same weights on Horovod workers, bytes held
  per worker, tensors handed to each collective, the formulas of both
- ``saved``   the notebook's ``#@save`` cells (Adam on a flat vector, data parallelism's step, ZeRO-1's
  update and stages 2 and 3), written by ``mgpu.runtime.saved``
"""
