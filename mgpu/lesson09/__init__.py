"""Notebook 09's helpers (``notebooks/09_*.ipynb``).

- ``figures``        the notebook's figures, one call each (saved to ``build/figures/``)
- ``model_parallel`` notebook 09's pipelines: GPipe schedules, bubble accounting, the timing harness

``model_parallel`` is notebook 09's subject (pipelines, GPipe, bubbles); notebook 06 imports two of its
small functions (micro-batch splits, activation sizes) from here as a preview.
"""
