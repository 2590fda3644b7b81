"""Notebook 11's helpers (``notebooks/11_*.ipynb``).

- ``batcher``          the exercise's batching loop run in threads on a queue, its batches counted
- ``figures``          the notebook's figures, one call each (saved to ``build/figures/``)
- ``half_precision``   section 3's CPU-checkable float16 pieces: tensor-core sizes, loss scaling
- ``inference_server`` the inference server (Triton or Ray Serve): started, stopped and its statistics read
- ``loadgen``          the open-loop load generator, its HTTP client and latency statistics
- ``queueing``         the queueing model of request batching and the batch-cost fit
- ``server_process``   the server's child process: Triton or Ray Serve serving the model until stopped
"""
