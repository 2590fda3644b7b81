"""Notebook 01's helpers (``notebooks/01_*.ipynb``).

- ``figures`` the notebook's figures, one call each (saved to ``build/figures/``)
- ``sgd``     notebook 01's toy problems: the linear neuron, the noise ball, GD's rate, the saddle
"""
