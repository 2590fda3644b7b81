"""Notebook 02's helpers (``notebooks/02_*.ipynb``).

- ``batch_study`` notebook 02's batch-size studies: steps-to-target, fits, scaling rules, warm-up
- ``figures``     the notebook's figures, one call each (saved to ``build/figures/``)
- ``keras_runs``  throughput and time-to-accuracy runs with the course callbacks
- ``multimodel``  many small MLPs trained side by side in one batched computation (notebook 02's sweeps)
- ``noise_scale`` the two-batch gradient noise scale estimator (McCandlish et al. 2018)
- ``saved``       the notebook's ``#@save`` cells (``scaled_lr``), written by ``mgpu.runtime.saved``
- ``sharpness``   epsilon-sharpness and 1-D interpolation (Keskar et al. 2017)

``noise_scale`` is taught here (the two-batch estimator) and reused by notebook 04's step costs
(:mod:`mgpu.lesson04.step_costs`), which import it from here.
"""
