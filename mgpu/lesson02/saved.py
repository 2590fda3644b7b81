"""What notebook 02 teaches, as its cells define it: generated from notebooks/02_batch_size.ipynb
by ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; see mgpu.runtime.saved)."""


# --- cell 1 of 1 ---
import numpy as np


def scaled_lr(base_lr, base_batch, batch, rule):
    # The learning rate for `batch`, given `base_lr` tuned at `base_batch`.
    k = batch / base_batch
    factors = {"linear": k, "sqrt": np.sqrt(k), "none": 1.0}
    if rule not in factors:
        raise ValueError(f"unknown scaling rule {rule!r}: choose linear, sqrt or none")
    return float(base_lr * factors[rule])
