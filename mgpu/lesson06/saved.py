"""What notebook 06 teaches, as its cells define it: generated from notebooks/06_sync_or_async.ipynb
by ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; see mgpu.runtime.saved)."""


# --- cell 1 of 1 ---
def staleness_aware_update(server, worker, gradient):
    # server.weights, server.lr, server.version (updates applied so far),
    # server.read_version[worker] (the version of the weights `worker` computed `gradient` on)
    tau = server.version - server.read_version[worker]
    server.weights -= (server.lr / max(tau, 1)) * gradient
    server.version += 1
    server.read_version[worker] = server.version   # the reply carries the new weights
    return tau
