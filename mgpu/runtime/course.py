"""Execute the course's notebooks headless with papermill, as `make course` and the tests do.

``python -m mgpu.runtime.course [--smoke] [--seed N] [NOTEBOOK ...]`` (``make course``) runs every notebook
in ``notebooks/`` (or the ones named) with its ``smoke`` and ``seed`` parameters set, writes the
executed copies to ``build/notebooks/``, carries on past a notebook that fails, and ends with one
table of seconds and failures (exit status 1 if any failed). Each notebook writes its own figures
and ``build/results/<stem>.json``.

A notebook fails on an exception (a check that did not hold raises) or on a printed ``FAILED``
line. A learner's run checks only what holds on any machine (exact sums, weights in sync, counts);
the timing claims a lesson makes are in :data:`CLAIMS`, read from the results files.

``python -m mgpu.runtime.course --check --seeds 0 1`` (``make course-check``) is the course's own test of
the setting learners run: every notebook for every seed, each seed in its own build folder
(``build/course-check/seed<N>/``), carrying on past a failure, and every claim of :data:`CLAIMS`
asserted on each run's results. It prints one table (notebook by seed: seconds, or the failure),
writes it to ``build/course-check/table.md`` and exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mgpu.runtime import paths

NOTEBOOKS_DIR = paths.ROOT / "notebooks"


@dataclass(frozen=True)
class Claim:
    """A timing claim a lesson's prose makes, asserted by ``make course-check`` on every seed.

    ``holds`` reads the notebook's results (``build/results/<stem>.json``); ``text`` is the claim
    as the lesson states it; ``full_only``: the smoke setting is too short for it.
    """

    text: str
    holds: Callable[[dict], bool]
    full_only: bool = True


def _async_within(r, factor):
    f = r["sync_async_final_loss"]
    return all(v <= factor * f["1 worker"] for k, v in f.items() if k.startswith("async"))


def _batches_match(r):
    backend = r.get("server_backend")
    if backend is None:
        return True
    top = max(r["rates_req_per_s"].values())  # Triton: below the top load, the runs that kept up
    kept_up = r["kept_up_by_rate_and_delay"]
    ratios = [v for k, v in r["mean_batch_over_model_at_long_delays"].items() if backend == "ray"
              or (not k.startswith(f"{top}@") and kept_up[k])]
    if backend == "ray":
        return all(v >= 0.95 for v in ratios)
    return all(v >= 0.8 for v in ratios) and (not ratios or sorted(ratios)[(len(ratios) - 1) // 2] <= 1.4)


def _longest_delay_largest_batch(r):
    if r.get("server_backend") is None:
        return True
    top = max(r["rates_req_per_s"].values())  # the batching rows at the top load that kept up: {delay: mean batch}
    batch = {float(k.split("@")[1]): r["mean_batch_by_rate_and_delay"][k] for k, kept in
             r["kept_up_by_rate_and_delay"].items() if kept and k.startswith(f"{top}@") and k != f"{top}@no batching"}
    return len(batch) < 2 or batch[max(batch)] == max(batch.values())


#: The timing claims of each notebook (by stem), checked over seeds and never in a learner's run.
CLAIMS: dict[str, list[Claim]] = {
    "02_batch_size": [
        Claim("throughput grows more than 3x from the smallest batch to the largest, and less than 2x over the "
              "last 4x step", lambda r: r["throughput_gain_smallest_to_largest"] > 3 and r["throughput_gain_last_step"] < 2),
        Claim("every batch size reaches the target, the largest in at least twice the epochs of the smallest",
              lambda r: all(r["reached_accuracy_by_batch"].values()) and r["epochs_largest_over_smallest_batch"] >= 2,
              full_only=False),
        Claim("perfect scaling at small batches: the steps-to-target slope lies in [-1.2, -0.8]",
              lambda r: -1.2 <= r["slope_small_batch"] <= -0.8),
        Claim("no gain at large batches: the slope lies in [-0.25, 0.15]",
              lambda r: -0.25 <= r["slope_large_batch"] <= 0.15, full_only=False),
        Claim("S_min (1 + B_crit / B) fits the steps within 30% (rms)", lambda r: r["steps_model_rms_misfit"] < 1.3),
        Claim("momentum extends perfect scaling: B_crit with momentum over without > 1.3",
              lambda r: r["b_crit_momentum_over_b_crit"] > 1.3, full_only=False),
        Claim("the gradient noise scale grows during training (at least 2x)", lambda r: r["b_simple_growth"] >= 2,
              full_only=False),
        Claim("B_simple predicts B_crit: their ratio lies in [0.5, 3] (smoke: [0.2, 10])",
              lambda r: (0.2 <= r["b_simple_over_b_crit"] <= 10) if r["smoke"]
              else (0.5 <= r["b_simple_over_b_crit"] <= 3), full_only=False),
        Claim("linear scaling holds at k = 4 (within 0.04 of the base)", lambda r: r["linear_k4_minus_base"] >= -0.04,
              full_only=False),
        Claim("linear scaling breaks at the largest k (at least 0.05 below the base)",
              lambda r: r["linear_largest_minus_base"] <= -0.05, full_only=False),
        Claim("constant warm-up is the worst of the three at the warm-up batch (by more than 0.05)",
              lambda r: r["constant_warmup_margin"] > 0.05, full_only=False),
        Claim("at equal epochs the small batch generalizes better (gap > 0.005)",
              lambda r: r["gap_small_vs_large"] > 0.005, full_only=False),
        Claim("the converged large-batch minimum is sharper (ratio > 1.5)", lambda r: r["sharpness_ratio"] > 1.5,
              full_only=False),
        Claim("with as many updates, the generalization gap at least halves",
              lambda r: r["gap_after_more_updates"] < r["gap_small_vs_large"] / 2, full_only=False),
    ],
    "03_input_pipeline": [
        Claim("the naive loader starves the accelerator (at most 0.5 of its ceiling)",
              lambda r: r["naive_over_ceiling"] <= 0.5, full_only=False),
        Claim("the best stage feeds the accelerator (at least 0.9 of its ceiling; smoke 0.8)",
              lambda r: r["best_over_ceiling"] >= (0.8 if r["smoke"] else 0.9), full_only=False),
        Claim("the best stage trains at least 2x the naive loader (smoke 1.4x)",
              lambda r: r["best_over_naive"] >= (1.4 if r["smoke"] else 2.0), full_only=False),
        Claim("the measurement is sound: no stage above 1.15x the ceiling",
              lambda r: r["max_fraction_of_ceiling"] <= 1.15, full_only=False),
        Claim("no stage before the best one trained faster than it (a later stage is never shown as a gain)",
              lambda r: all(v is None or v <= r["best_over_ceiling"] or v > 1.15 for v in
                            list(r["fraction_of_float32_ceiling_by_stage"].values())
                            [:list(r["fraction_of_float32_ceiling_by_stage"]).index(r["best_stage"])]),
              full_only=False),
        Claim("the exercise's pipeline feeds the accelerator (at least 0.9 of its ceiling; smoke 0.8)",
              lambda r: r["your_pipeline_over_ceiling"] >= (0.8 if r["smoke"] else 0.9), full_only=False),
        Claim("a prefetching stage whose pipeline alone has a clear margin (1.2x the device) feeds it (0.9)",
              lambda r: all(r["fraction_of_ceiling_by_stage"][s] >= 0.9
                            for s in ("prefetch", "cache", "batched_augment", "uint8_transfer")
                            if r["pipeline_alone_images_per_s_by_stage"][s] >= 1.2 * r["ceiling_images_per_s_by_stage"][s])),
    ],
    "04_horovod": [
        Claim("on the simulated accelerator, 2 workers run at least 1.8x one worker",
              lambda r: r["speedup_by_workers"]["2"] >= 1.8),
        Claim("on the simulated accelerator, 4 workers run at least 3.0x one worker",
              lambda r: r["speedup_by_workers"]["4"] >= 3.0),
        Claim("every worker's math fits in its device's time (overruns in at most 1% of the steps)",
              lambda r: r["device_overruns"] <= 0.01 * r["device_steps"]),
        Claim("B_simple from the workers' gradients is positive and finite",
              lambda r: r["b_simple_from_workers"] is not None and r["b_simple_from_workers"] > 0),
        Claim("the measurement is sound: on the real cores no speed-up exceeds min(N, cores) by more than 50% "
              "(a lone worker leaves part of its core idle, so a little above it is no error; the cell warns past 1.5x)",
              lambda r: all(v <= 1.5 * min(int(n), max(1, r["cores"] // r["cores_per_simulated_gpu"]))
                            for n, v in r["speedup_by_workers_real_cores"].items())),
    ],
    "05_accuracy_at_scale": [
        Claim("on the simulated accelerator, the fastest 4-worker recipe reaches the target in at most half "
              "the single worker's time", lambda r: r["best_4_worker_time_over_single"] <= 0.5),
        Claim("the best 4-worker recipe beats no scaling by at least 0.02 (min_gain)",
              lambda r: r["no_scaling_gap"] >= 0.02),
        Claim("the best 4-worker recipe ends within 0.03 of one worker (tolerance)",
              lambda r: r["best_recipe_gap"] <= 0.03),
        Claim("the linearly scaled rate with warm-up, LARS and LAMB do not collapse",
              lambda r: not any(r["diverged_by_recipe"][k] for k in ("linear + warm-up", "LARS", "LAMB"))),
        Claim("every worker's math fits in its device's time (overruns in at most 1% of the steps)",
              lambda r: r["device_overruns"] <= 0.01 * r["device_steps"]),
    ],
    "06_sync_or_async": [
        Claim("on the modelled device, asynchronous SGD on 4 workers applies its updates at least 2.5x as fast "
              "as one worker", lambda r: r["async_speedup_over_one_worker"] >= 2.5, full_only=False),
        Claim("at the moderate rate, every asynchronous run ends within 1.25x of one worker's loss",
              lambda r: _async_within(r, 1.25)),
        Claim("at the high rate, the staleness-aware asynchronous run ends within 2x of the synchronous run's loss",
              lambda r: r["staleness_aware_over_sync_loss"] <= 2, full_only=False),
        Claim("ParameterServerStrategy on 2 workers: the mean staleness is above 0 and at most 1",
              lambda r: 0 < r["tf_ps_staleness_mean"] <= 1, full_only=False),
        Claim("on the toy server, a 3x straggler slows synchronous SGD at least 1.8x per gradient",
              lambda r: r["toy_sync_straggler_slowdown"] >= 1.8),
        Claim("on the toy server, the straggler slows asynchronous SGD at most 1.5x, and less than synchronous SGD",
              lambda r: r["toy_async_straggler_slowdown"] <= 1.5
              and r["toy_async_straggler_slowdown"] < r["toy_sync_straggler_slowdown"]),
        Claim("on Horovod, the straggler slows the synchronous step at least 2.2x",
              lambda r: r["straggler_sync_slowdown"] >= 2.2),
        Claim("the weighted [3, 1] split is at least 1.5x as fast as the even split with the straggler",
              lambda r: r["uneven_split_gain"] >= 1.5),
        Claim("the weighted [3, 1] split recovers at least 0.5 of the throughput without a straggler",
              lambda r: r["uneven_split_recovery"] >= 0.5),
    ],
    "07_communication": [
        Claim("the all-reduce is a latency plus a slope: the 2-worker fit of a + n / b has R^2 >= 0.8",
              lambda r: r["cost_model_r2"] >= 0.8),
        Claim("fusion speeds up the step of many small tensors (at least 1.2x)", lambda r: r["fusion_speedup"] >= 1.2,
              full_only=False),
        Claim("on the simulated accelerator, overlap hides part of the all-reduce (hidden fraction at least 0.1)",
              lambda r: r["overlap_hidden_fraction"] >= 0.1),
        Claim("every worker's math fits in its device's time (overruns in at most 10% of the waits)",
              lambda r: r["overlap_device_overruns"] <= 0.10 * r["overlap_device_waits"]),
    ],
    "09_model_parallelism": [
        Claim("on 2 stages, the largest number of micro-batches cuts the naive split's idle fraction by at least 0.1",
              lambda r: r["pipeline_idle_drop"] >= 0.1, full_only=False),
        Claim("on 2 stages, 16 micro-batches at least halve the naive split's idle fraction",
              lambda r: r["pipeline_idle_by_micro_batches"][str(r["pipeline_micro_batches_max"])]
              <= r["pipeline_idle_by_micro_batches"]["1"] / 2),
        Claim("on 2 stages, micro-batches bring the idle fraction below the naive split's at every M > 1",
              lambda r: all(v < r["pipeline_idle_by_micro_batches"]["1"]
                            for m, v in r["pipeline_idle_by_micro_batches"].items() if m != "1"), full_only=False),
        Claim("on 2 stages, the largest M idles more than GPipe's bubble, not down to its curve (the hand-overs)",
              lambda r: r["pipeline_bubble_measured_vs_theory"] > 1),  # smoke's largest M is 4: can land below
        Claim("on the simulated accelerator (4 stage processes, the largest M), GPipe idles near (N-1)/(M+N-1): "
              "measured / theory in [0.9, 1.6]",
              lambda r: 0.9 <= r["pipeline_bubble_measured_vs_theory_gpipe"] <= 1.6),
        Claim("on the simulated accelerator, 1F1B idles 0.9x to 2.2x its bubble (looser than GPipe: each backward "
              "waits for a gradient just handed over, so hand-overs add more)",
              lambda r: 0.9 <= r["pipeline_bubble_measured_vs_theory_1f1b"] <= 2.2),
        Claim("on the simulated accelerator, GPipe's step is shorter at the largest M than at the smallest",
              lambda r: (lambda s: s[max(s, key=int)] < s[min(s, key=int)])(
                  r["pipeline_sim_gpipe_step_ms_by_micro_batches"])),
    ],
    "10_several_machines": [
        Claim("the elastic run that lost a worker mid-epoch ends within 0.02 of the undisturbed run's test accuracy",
              lambda r: abs(r["elastic_accuracy_gap"]) <= 0.02),
    ],
    "11_serving": [
        Claim("model.predict costs at least 30x a tf.function call at batch 1",
              lambda r: r["predict_over_tf_function_batch1"] >= 30, full_only=False),
        Claim("a tf.function call on 100 samples takes at most 5x the time of a call on one",
              lambda r: r["tf_function_batch100_over_batch1"] <= 5, full_only=False),
        Claim("at batch 100 the arithmetic is at most 5% of a tf.function call",
              lambda r: r["arithmetic_share_batch100"] <= 0.05, full_only=False),
        Claim("your batcher answers a burst of requests at least 2x as fast with batching as without",
              lambda r: r["own_batcher_throughput_gain"] >= 2, full_only=False),
        Claim("Triton: at the top load, the best batching delay answers at least 1.3x the requests per second of "
              "one-at-a-time serving", lambda r: r.get("server_backend") != "triton" or r["serving_throughput_gain"] >= 1.3,
              full_only=False),
        Claim("Triton: at the top load, one-at-a-time serving's mean latency is at least 30x the best delay's "
              "(smoke, 1.5 s runs: 10x)", lambda r: r.get("server_backend") != "triton"
              or r["no_batching_over_best_mean_latency_at_high_rate"] >= (10 if r["smoke"] else 30), full_only=False),
        Claim("Triton: at the top load, a 16 ms delay costs the server at most 0.6x the CPU per request of no batching",
              lambda r: r.get("server_backend") != "triton"
              or r["high_rate_server_cpu_largest_delay_over_no_batching"] <= 0.6, full_only=False),
        Claim("Ray Serve: at least 60% of the server's CPU per request is spent outside the model's call",
              lambda r: r.get("server_backend") != "ray" or r["server_cpu_outside_model_share"] >= 0.6, full_only=False),
        Claim("at delays of 8 and 16 ms, below the top load, where the server keeps up, Triton's mean batch is at "
              "least 0.8x the queueing model's, 1.4x at most in the median (Ray's at least 0.95x at every load)",
              _batches_match, full_only=False),
        Claim("at the top load, of the batching rows that keep up, the longest delay's makes the largest batches",
              _longest_delay_largest_batch, full_only=False),
        Claim("at the lowest load, a 16 ms delay adds at least 6.4 ms to the median latency",
              lambda r: r.get("server_backend") is None or r["low_rate_cost_of_largest_delay_ms"] >= 6.4,
              full_only=False),
    ],
}


def claims_failed(stem: str, results_file: Path, *, smoke: bool) -> list[str]:
    """The claims of ``stem`` that its results do not bear out (a missing file or key fails them all)."""
    claims = [c for c in CLAIMS.get(stem, []) if not (smoke and c.full_only)]
    if not claims:
        return []
    try:
        record = json.loads(results_file.read_text())
    except (OSError, ValueError) as error:
        return [f"no results to check the claims against ({error})"]
    failed = []
    for claim in claims:
        try:
            held = bool(claim.holds(record))
        except (KeyError, TypeError) as error:
            held = False
            failed.append(f"claim not checked ({type(error).__name__}: {error}): {claim.text}")
            continue
        if not held:
            failed.append(f"claim did not hold: {claim.text}")
    return failed


def course_notebooks() -> list[Path]:
    """The course's notebooks in the order a learner takes them."""
    return sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def run_notebook(notebook: Path, *, smoke: bool, seed: int = 0, output_dir: Path | None = None,
                 parameters: dict | None = None, progress: bool = True) -> Path:
    """Execute one notebook with papermill; returns the executed copy's path.

    Raises papermill's PapermillExecutionError (with the failing cell) when a cell fails.
    """
    import papermill

    output_dir = output_dir or paths.build_dir() / "notebooks"
    output_dir.mkdir(parents=True, exist_ok=True)
    output = output_dir / notebook.name
    papermill.execute_notebook(
        str(notebook), str(output),
        parameters={"smoke": smoke, "seed": seed, **(parameters or {})},
        kernel_name="python3", cwd=str(notebook.parent), progress_bar=progress,
        log_output=False,
    )
    return output


def printed_failures(executed: Path) -> list[str]:
    """The lines an executed notebook printed that report a failure (``FAILED``), in order."""
    import nbformat

    lines = []
    for cell in nbformat.read(executed, as_version=4).cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                lines += [line.strip() for line in output.get("text", "").splitlines() if "FAILED" in line]
    return lines


def run_and_judge(notebook: Path, *, smoke: bool, seed: int, claims: bool = False,
                  progress: bool = True) -> tuple[float, str | None]:
    """Run one notebook; its seconds and the first problem (None when it passed)."""
    started = time.monotonic()
    try:
        executed = run_notebook(notebook, smoke=smoke, seed=seed, progress=progress)
        problem = next(iter(printed_failures(executed)), None)
    except Exception as error:  # papermill's error ends with the failing cell's exception
        text = str(error).strip()
        problem = text.splitlines()[-1] if text else type(error).__name__
    if problem is None and claims:
        problem = next(iter(claims_failed(notebook.stem, paths.results_dir() / f"{notebook.stem}.json",
                                          smoke=smoke)), None)
    return time.monotonic() - started, problem


def check(notebooks: list[Path], seeds: list[int], *, smoke: bool) -> int:
    """Run every notebook for every seed, carry on past failures, print and save the table."""
    root = paths.build_dir() / "course-check"
    cells: dict[str, dict[int, str]] = {nb.stem: {} for nb in notebooks}
    failed = 0
    saved = os.environ.get("MGPU_BUILD_DIR")
    try:
        for seed in seeds:
            os.environ["MGPU_BUILD_DIR"] = str(root / f"seed{seed}")  # the kernels inherit it
            for notebook in notebooks:
                print(f"== seed {seed}: {notebook.name} (smoke={smoke})", flush=True)
                seconds, problem = run_and_judge(notebook, smoke=smoke, seed=seed, claims=True, progress=False)
                failed += problem is not None
                cells[notebook.stem][seed] = f"{seconds:.0f} s" + (f", FAILED: {problem[:200]}" if problem else "")
                print(f"   {cells[notebook.stem][seed]}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("MGPU_BUILD_DIR", None)
        else:
            os.environ["MGPU_BUILD_DIR"] = saved
    table = ["| notebook | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|" + "---|" * len(seeds)]
    table += [f"| {stem} | " + " | ".join(row[s] for s in seeds) + " |" for stem, row in cells.items()]
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(["", *table, "", f"{failed} failed; executed copies under {root}/seed<N>/notebooks/"]))
    return 1 if failed else 0


def by_number(name: str) -> Path:
    """A notebook named by its number ("03", "3") or by its path."""
    if name.isdigit():
        found = [p for p in course_notebooks() if p.name.startswith(f"{int(name):02d}_")]
        if found:
            return found[0]
    return Path(name).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.runtime.course", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="paths, or numbers such as 03 (default: every notebook)")
    parser.add_argument("--smoke", action="store_true", help="the few-minutes setting (CI)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true",
                        help="run every notebook for each of --seeds, carry on past failures, print a table")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="with --check (default: 0 1)")
    args = parser.parse_intermixed_args(argv)  # notebooks may come before or after the options
    notebooks = [by_number(name) for name in args.notebooks] or course_notebooks()
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.check:
        return check(notebooks, args.seeds, smoke=args.smoke)
    rows, failed = [], 0
    for notebook in notebooks:
        print(f"== {notebook.name} (smoke={args.smoke}, seed={args.seed})", flush=True)
        seconds, problem = run_and_judge(notebook, smoke=args.smoke, seed=args.seed)
        failed += problem is not None
        rows.append((notebook.name, seconds, problem))
        if problem:
            print(f"   FAILED after {seconds:.0f} s: {problem[:300]}\n   executed copy with the error: "
                  f"{paths.build_dir() / 'notebooks' / notebook.name}; carrying on with the next notebook",
                  file=sys.stderr, flush=True)
        else:
            print(f"   done in {seconds:.0f} s", flush=True)
    print("\n".join(["", f"{'notebook':<36} {'seconds':>7}  result"]
                    + [f"{name:<36} {seconds:7.0f}  {'FAILED: ' + problem[:200] if problem else 'passed'}"
                       for name, seconds, problem in rows]
                    + [f"{'total':<36} {sum(r[1] for r in rows):7.0f}  {failed} failed"]))
    print(f"executed copies: {paths.build_dir() / 'notebooks'}  results: {paths.results_dir()}  "
          f"figures: {paths.figures_dir()}")
    return 1 if failed else 0

if __name__ == "__main__":
    raise SystemExit(main())
