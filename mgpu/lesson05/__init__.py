"""Notebook 05's helpers (``notebooks/05_*.ipynb``).

- ``figures``    the notebook's figures, one call each (saved to ``build/figures/``)
- ``optimizers`` LARS and LAMB, the large-batch optimizers TensorFlow 2.15 lacks
- ``recipes``    notebook 05's accuracy-at-scale recipes (LR scaling, warm-up, momentum, LARS/LAMB)
"""
