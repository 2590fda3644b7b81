"""Notebook 09's helpers (``notebooks/09_*.ipynb``).

- ``figures``        the notebook's figures, one call each (saved to ``build/figures/``)
- ``model_parallel`` notebook 09's pipelines (GPipe and 1F1B orders, bubble accounting, threads and stage
  processes), the tensor-parallel harness and the layout cost model

``model_parallel`` is notebook 09's subject (pipelines, GPipe, bubbles); notebook 06 imports two of its
small functions (micro-batch splits, activation sizes) from here as a preview.
"""
