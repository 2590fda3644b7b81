"""Notebook 06's helpers (``notebooks/06_*.ipynb``).

- ``async_sgd`` notebook 06's parameter-server runs: the toy's problem, traffic counts, the uneven split,
  stragglers on Horovod, TensorFlow's ParameterServerStrategy in a child process
- ``figures``   the notebook's figures, one call each (saved to ``build/figures/``)
"""
