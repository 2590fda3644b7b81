"""What notebook 04 teaches, as its cells define it: generated from notebooks/04_horovod.ipynb
by ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; see mgpu.runtime.saved)."""


# --- cell 1 of 1 ---
import numpy as np


def ring_allreduce(inputs):
    # Returns (each worker's sum of all inputs, bytes each worker sent).
    n, shape = len(inputs), np.shape(inputs[0])
    chunks = [[c.copy() for c in np.array_split(np.ravel(a), n)] for a in inputs]
    sent = np.zeros(n, dtype=np.int64)
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            offset = s if phase == "reduce-scatter" else s - 1
            payload = [(i, (i - offset) % n, chunks[i][(i - offset) % n].copy()) for i in range(n)]
            for i, c, data in payload:
                receiver = chunks[(i + 1) % n]
                receiver[c] = receiver[c] + data if phase == "reduce-scatter" else data
                sent[i] += data.nbytes
    return [np.concatenate(worker).reshape(shape) for worker in chunks], sent
