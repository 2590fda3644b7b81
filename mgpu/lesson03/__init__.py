"""Notebook 03's helpers (``notebooks/03_*.ipynb``).

- ``alexnet``     AlexNet (single tower) and the training step notebook 03's pipelines feed
- ``figures``     the notebook's figures, one call each (saved to ``build/figures/``)
- ``imagefolder`` notebook 03's folder of JPEG files and TFRecord shards
- ``pipeline``    notebook 03's input pipelines, stage by stage, and their measurement
"""
