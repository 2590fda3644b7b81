"""Notebook 11's server process: the child that :class:`mgpu.lesson11.inference_server.InferenceServer`
starts as ``python -m mgpu.lesson11.server_process serve ...``.

It loads the saved Keras model and serves it under one name per batching delay with NVIDIA Triton
(``nvidia-pytriton``) or Ray Serve (``@serve.batch``), until its parent stops it or dies; it runs in
its own process group, so stopping it ends everything it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from mgpu.lesson11.inference_server import BACKENDS, NO_BATCHING, model_name


def _load_traced(model_path: str, threads: int | None):
    """The saved model as a traced call on float32 rows, traced once before the first request."""
    import mgpu  # noqa: F401  (Keras 2 on TensorFlow 2.16+, before tensorflow)
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    model = tf.keras.models.load_model(model_path, compile=False)
    features = int(model.input_shape[-1])
    predict = tf.function(model, input_signature=[tf.TensorSpec([None, features], tf.float32)])
    predict(tf.zeros([1, features]))
    return (lambda rows: predict(tf.constant(rows)).numpy()), features


def _stop_signals() -> tuple[threading.Event, threading.Event]:
    """``(stop, orphaned)``: stop is set by SIGTERM, SIGINT or the parent's death, orphaned by the last.

    The child's stdin is a pipe from the parent: EOF means the parent exited, however it died.
    """
    stop, orphaned = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def parent_gone():
        try:
            while os.read(0, 4096):  # the raw descriptor: no lock for the interpreter's shutdown to wait on
                pass
            orphaned.set()
        finally:
            stop.set()

    threading.Thread(target=parent_gone, daemon=True).start()
    return stop, orphaned


def _serve_triton(model_path: str, delays_ms: list[float], max_batch: int, ports: tuple[int, int, int],
                  workspace: str, threads: int | None) -> None:
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    predict, features = _load_traced(model_path, threads)

    @batch
    def infer_func(x):
        return {"y": predict(x)}

    stop, orphaned = _stop_signals()
    http, grpc, metrics = ports
    config = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1", grpc_port=grpc,
                          metrics_port=metrics, exit_timeout_secs=10, log_verbose=0)
    security = TritonSecurityConfig(restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"])
    inputs = [Tensor(name="x", dtype=np.float32, shape=(features,))]
    outputs = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
    with Triton(config=config, workspace=workspace, security_config=security) as triton:
        triton.bind(model_name=NO_BATCHING, infer_func=infer_func, inputs=inputs, outputs=outputs,
                    config=ModelConfig(max_batch_size=1))
        for delay in delays_ms:
            batcher = DynamicBatcher(max_queue_delay_microseconds=int(round(delay * 1000)))
            triton.bind(model_name=model_name(delay), infer_func=infer_func, inputs=inputs, outputs=outputs,
                        config=ModelConfig(max_batch_size=max_batch, batcher=batcher))
        triton.run()
        print("serving", flush=True)
        while not stop.wait(0.5):
            pass
        print("stopping", flush=True)
    for block in Path("/dev/shm").glob(f"pytrtion{os.getpid()}-*"):  # what pytriton may leave behind
        block.unlink(missing_ok=True)
    if orphaned.is_set():  # nobody is left to remove the server's folder
        shutil.rmtree(Path(workspace).parent, ignore_errors=True)


class _RayModels:
    """Ray Serve's replica: the model, one ``@serve.batch`` queue per model name, and Triton's routes.

    One batch runs at a time, as with Triton's one model instance: requests that arrive while it
    computes wait for the next. The compute time is recorded per batch size in the shape of
    Triton's statistics.
    """

    def __init__(self, model_path: str, delays_ms: list[float], max_batch: int, threads: int | None):
        from ray import serve

        self.predict, self.features = _load_traced(model_path, threads)
        self.counts = {}
        self.handlers = {NO_BATCHING: self._batcher(NO_BATCHING, serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0))}
        for delay in delays_ms:
            rows = serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=delay / 1e3,
                               batch_size_fn=lambda items: sum(len(item) for item in items))
            self.handlers[model_name(delay)] = self._batcher(model_name(delay), rows)

    def _batcher(self, name: str, decorator):
        counts = self.counts[name] = {"executions": 0, "requests": 0, "by_size": {}}

        async def run(items: list) -> list:
            rows = np.concatenate(items)
            begin = time.perf_counter_ns()
            out = self.predict(rows)  # on the replica's event loop: requests arriving meanwhile queue up
            spent = time.perf_counter_ns() - begin
            count, ns = counts["by_size"].get(len(rows), (0, 0))
            counts["by_size"][len(rows)] = (count + 1, ns + spent)
            counts["executions"] += 1
            counts["requests"] += len(rows)
            return list(np.split(out, np.cumsum([len(item) for item in items])[:-1]))

        return decorator(run)

    def _stats(self, name: str) -> dict:
        counts = self.counts[name]
        zero = {"count": 0, "ns": 0}
        return {"model_stats": [{
            "name": name, "execution_count": counts["executions"], "inference_count": counts["requests"],
            "batch_stats": [{"batch_size": size, "compute_infer": {"count": count, "ns": ns},
                             "compute_input": zero, "compute_output": zero}
                            for size, (count, ns) in sorted(counts["by_size"].items())]}]}

    async def __call__(self, request):
        from starlette.responses import JSONResponse, PlainTextResponse

        *_, name, action = request.url.path.rstrip("/").split("/")
        if name not in self.handlers or action not in ("ready", "stats", "infer"):
            return PlainTextResponse(f"no model {name!r} or no route {action!r}", status_code=404)
        if action == "ready":
            return PlainTextResponse("ready")
        if action == "stats":
            return JSONResponse(self._stats(name))
        body = await request.body()
        split = int(request.headers.get("inference-header-content-length", len(body)))
        shape = json.loads(body[:split])["inputs"][0]["shape"]
        rows = np.frombuffer(body[split:], dtype=np.float32).reshape(shape)
        out = await self.handlers[name](rows)
        return JSONResponse({"outputs": [{"name": "y", "datatype": "FP32", "shape": list(out.shape),
                                          "data": out.ravel().tolist()}]})


def _serve_ray(model_path: str, delays_ms: list[float], max_batch: int, http_port: int,
               workspace: str, threads: int | None) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report sent from a course's notebook
    # Ray's workers import this module: give them the course on their path, wherever it was imported from.
    course = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join([course] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    if not Path(model_path).exists():  # before Ray starts, rather than in a replica it would retry
        raise FileNotFoundError(f"no saved model at {model_path}")
    import ray
    from ray import serve

    stop, orphaned = _stop_signals()
    Path(workspace).mkdir(parents=True, exist_ok=True)
    # A small object store (Ray's default takes 30% of the memory in /dev/shm; requests here are bytes).
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, _temp_dir=str(Path(workspace) / "ray"),
             object_store_memory=100 * 2 ** 20, logging_level="WARNING", configure_logging=True)
    try:
        quiet = {"log_level": "WARNING", "enable_access_log": False}  # no log line per request
        serve.start(http_options={"host": "127.0.0.1", "port": http_port}, logging_config=quiet)
        deployment = serve.deployment(_RayModels, name="models", ray_actor_options={"num_cpus": 0},
                                      max_ongoing_requests=100_000, logging_config=quiet)
        serve.run(deployment.bind(model_path, delays_ms, max_batch, threads), name="models",
                  route_prefix="/v2/models", blocking=False)
        print("serving", flush=True)
        while not stop.wait(0.5):
            pass
        print("stopping", flush=True)
        serve.shutdown()
    finally:
        ray.shutdown()
    if orphaned.is_set():  # nobody is left to remove the server's folder
        shutil.rmtree(Path(workspace).parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.lesson11.server_process")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a saved Keras model with Triton or Ray Serve (the notebook starts this)")
    serve.add_argument("--backend", choices=BACKENDS, required=True)
    serve.add_argument("--model", required=True)
    serve.add_argument("--delays-ms", default="0")
    serve.add_argument("--max-batch", type=int, default=64)
    serve.add_argument("--http-port", type=int, required=True)
    serve.add_argument("--grpc-port", type=int, required=True)
    serve.add_argument("--metrics-port", type=int, required=True)
    serve.add_argument("--workspace", required=True)
    serve.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    delays = [float(d) for d in args.delays_ms.split(",") if d.strip()]
    if args.backend == "triton":
        _serve_triton(args.model, delays, args.max_batch, (args.http_port, args.grpc_port, args.metrics_port),
                      args.workspace, args.threads)
    else:
        _serve_ray(args.model, delays, args.max_batch, args.http_port, args.workspace, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
