"""Notebook 04's helpers (``notebooks/04_*.ipynb``).

- ``allreduce``  a from-scratch ring all-reduce in numpy, to step through
- ``conversion`` notebook 04's training script, one Horovod conversion step at a time
- ``figures``    the notebook's figures, one call each (saved to ``build/figures/``)
- ``ranks``      what each rank of the learner's converted script did (weights, losses, shard), gathered for checks
- ``saved``      the notebook's ``#@save`` cells (the ring all-reduce of its exercise), written by ``mgpu.runtime.saved``
- ``step_costs`` time in compute vs all-reduce per step, and per-worker gradient norms

``allreduce`` is taught here (the ring all-reduce, stepped through); notebook 06,
:mod:`mgpu.lesson06.async_sgd` and :mod:`mgpu.lesson09.model_parallel` import it from here.
"""
