"""Notebook 00's helpers (``notebooks/00_*.ipynb``).

- ``figures`` the notebook's figures, one call each (saved to ``build/figures/``)
"""
