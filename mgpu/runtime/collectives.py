"""What a worker hands to Horovod's collectives: one recorder for the lessons that count bytes (07, 08).

:func:`wire_log` patches ``horovod.tensorflow``'s ``_allreduce`` and ``_reducescatter`` (what
``hvd.allreduce`` and ``hvd.reducescatter`` call after compressing, so the tensor that really
travels is seen) and ``allgather`` while a block runs, and lists every tensor they get. Code must
call them as ``hvd.allreduce`` / ``hvd.reducescatter`` / ``hvd.allgather`` (attributes of the module
looked up at the call), as the lessons' code does.
"""

from __future__ import annotations

import contextlib

import numpy as np

__all__ = ["wire_log", "last_trace"]

#: The functions patched, and the name each entry's ``op`` gets.
_PATCHED = {"_allreduce": "allreduce", "_reducescatter": "reducescatter", "allgather": "allgather"}


@contextlib.contextmanager
def wire_log(keep_values: bool = False):
    """Record every tensor handed to Horovod's all-reduce, reduce-scatter and all-gather while the block runs.

    Yields a list of dicts (``op``, ``dtype``, ``shape``, ``bytes``, ``trace``, and ``value`` when
    ``keep_values`` and running eagerly). Inside ``tf.function`` it records when the step is traced
    (the static shapes): trace the step inside the block. ``trace`` tells the traces apart (a step
    that creates variables is traced twice; None when eager): :func:`last_trace` keeps the last.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    log, graphs = [], []  # the graphs traced, kept alive so that each keeps its number

    def trace_number(graph):
        if not any(g is graph for g in graphs):
            graphs.append(graph)
        return next(i for i, g in enumerate(graphs) if g is graph)

    originals = {name: getattr(hvd, name) for name in _PATCHED}

    def recording(name):
        def call(tensor, *args, **kwargs):
            tensor = tf.convert_to_tensor(tensor)
            entry = {"op": _PATCHED[name], "dtype": tensor.dtype.name, "shape": tuple(tensor.shape),
                     "bytes": int(np.prod(tensor.shape)) * tensor.dtype.size,
                     "trace": None if tf.executing_eagerly() else trace_number(tf.compat.v1.get_default_graph())}
            if keep_values and tf.executing_eagerly():
                entry["value"] = tensor.numpy()
            log.append(entry)
            return originals[name](tensor, *args, **kwargs)
        return call

    for name in originals:
        setattr(hvd, name, recording(name))
    try:
        yield log
    finally:
        for name, fn in originals.items():
            setattr(hvd, name, fn)


def last_trace(log: list[dict]) -> list[dict]:
    """The entries of :func:`wire_log` recorded by the last trace of a ``tf.function`` (all, if eager)."""
    return [e for e in log if e["trace"] == log[-1]["trace"]] if log else []
