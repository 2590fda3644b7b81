"""Notebook 10's helpers (``notebooks/10_*.ipynb``).

- ``multinode``     notebook 10's host plans, multi-machine commands and their dry run
- ``slurm_horovod`` notebook 10's Horovod job inside a Slurm allocation, started by srun without ssh or MPI
- ``faults``        notebook 10's fault jobs around the training: a job in the background that loses a worker
  and takes one back, the comparison of a restarted run with the killed one, a hang and the rank that causes it
- ``saved``         the training functions notebook 10 teaches (``elastic_train``, ``checkpoint_train``), generated
  from its ``#@save`` cells

``multinode`` and ``slurm_horovod`` are this lesson's subject (running Horovod on several machines,
under Slurm). The launcher (:mod:`mgpu.runtime.launch`, for ``hosts=``) and the grader's Slurm mode
(``autograder/slurm.py``) reuse them from here.
"""
