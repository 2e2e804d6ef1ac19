"""The benchmark tables of docs/benchmarks.md, generated from ``benchmarks/results/bench_*.json``.

docs/benchmarks.md marks each table's place with ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``; this script rewrites what lies between them. Each
table ends with the command that reproduces it, and says which targets were
missed. Targets that the JSON does not record are the benchmark issues' own.

    .venv/bin/python benchmarks/tables.py            # rewrite docs/benchmarks.md and README.md's regions
    .venv/bin/python benchmarks/tables.py --check    # exit 1 if either is stale, or prose quotes a number

README.md's regions (``readme_table``) summarize tables of the page from the same JSON.

``--check`` also reads README.md and every docs/*.md page: a measured number
(a decimal with a unit, a ratio or a share) may stand only inside a
generated table, so prose cannot drift from the JSON; a number that states a
setting or a target rather than a measurement is listed in ``SETTINGS``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
REGION = re.compile(r"(<!-- bench:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)
RUN = ".venv/bin/python benchmarks/"

Table = Callable[[Callable[[str], dict]], list[str]]
TABLES: dict[str, Table] = {}


def table(name: str) -> Callable[[Table], Table]:
    def register(function: Table) -> Table:
        TABLES[name] = function
        return function

    return register


README = ROOT / "README.md"
README_TABLES: dict[str, Table] = {}  # regions of README.md: summaries of tables on the benchmarks page


def readme_table(name: str) -> Callable[[Table], Table]:
    def register(function: Table) -> Table:
        README_TABLES[name] = function
        return function

    return register


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(*names: str) -> list[str]:
    return [row(*names), row(*("---" for _ in names))]


def reproduce(command: str, note: str = "", *, quick: bool = False) -> str:
    """The command that made a table's JSON (a quick run must be told to write into the results)."""
    if quick:
        command += " --quick --out benchmarks/results"
    return f"Reproduce: `{RUN}{command}`{note}."


def size(mib: float) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def missed(misses: list[str]) -> str:
    return "Targets missed: " + "; ".join(misses) + "." if misses else "Every target is met."


@table("canzona_plan")
def canzona_plan(load: Callable[[str], dict]) -> list[str]:
    plans = load("canzona")["plan_quality"]
    columns = ("start-point", "layer-wise", "alpha=0", "alpha=0.5", "alpha=1", "ideal LPT")
    lines = header("model", "ranks", *(c.replace("alpha", "α") for c in columns))
    chosen = [r for r in plans["rows"] if r["model"] in ("8B", "32B")]
    for r in chosen:
        lines.append(
            row(f"Qwen3-{r['model']}", r["D"], *(f"{r['plans'][c]['compute_max_over_mean']:.2f}" for c in columns))
        )
    at_8 = {r["model"]: r["plans"]["alpha=1"]["compute_max_over_mean"] for r in chosen if r["D"] == 8}
    misses = [f"α=1 on Qwen3-{m} at 8 ranks is {v:.2f} (target ≤ 1.05)" for m, v in at_8.items() if v > 1.05]
    return [
        f"Newton–Schulz FLOPs max/mean over ranks, {plans['bucket_elements'] / 1e6:.0f}M-element buckets:",
        "",
        *lines,
        "",
        missed(misses),
        reproduce(f"bench_canzona.py --layers {load('canzona')['optimizer_step']['layers']}", " (with the step below)"),
    ]


@table("canzona_step")
def canzona_step(load: Callable[[str], dict]) -> list[str]:
    step = load("canzona")["optimizer_step"]
    runs = step["runs"]
    ranks = [r["D"] for r in runs]
    lines = header("variant", *(f"{d} ranks: compute s" for d in ranks), *(f"{d} ranks: MiB sent" for d in ranks))
    for variant in runs[0]["variants"]:
        cells = [run["variants"][variant] for run in runs]
        lines.append(
            row(
                variant,
                *(f"{c['compute_max_s']:.2f}" for c in cells),
                *(f"{c['wire_bytes_max'] / 2**20:.0f}" for c in cells),
            )
        )
    misses = []
    for run in runs:
        if run["alpha1_speedup_over_redundant"] < run["target_speedup"]:
            misses.append(
                f"α=1 at {run['D']} ranks is {run['alpha1_speedup_over_redundant']:.2f}× redundant DDP "
                f"(target {run['target_speedup']:.1f}×)"
            )
        if run["alpha1_critical_path_over_ideal"] > 1.1:
            misses.append(
                f"α=1 critical path at {run['D']} ranks is {run['alpha1_critical_path_over_ideal']:.2f}× "
                "the ideal total/D (target ≤ 1.1×)"
            )
    speedups = ", ".join(f"{r['alpha1_speedup_over_redundant']:.2f}× at {r['D']} ranks" for r in runs)
    layers = f"{step['layers']} of {step['full_model_layers']} layers"
    return [
        f"Optimizer step, {step['model']} ({layers}), {step['backend']}; critical-path compute per step "
        f"({step['compute_clock']}, the slowest rank, mean of {step['timed_steps']} steps) and bytes sent by the "
        "busiest rank:",
        "",
        *lines,
        "",
        f"α=1 Canzona against redundant DDP compute: {speedups}.",
        missed(misses),
        reproduce(f"bench_canzona.py --layers {step['layers']}", " (all 36 layers without `--layers`)"),
    ]


@table("canzona_volume")
def canzona_volume(load: Callable[[str], dict]) -> list[str]:
    volume = load("canzona")["collective_volume"]
    ranks = sorted({r["D"] for r in volume["rows"]})
    lines = header("model", *(f"{d} ranks: padded" for d in ranks), *(f"{d} ranks: exact" for d in ranks))
    for model in dict.fromkeys(r["model"] for r in volume["rows"]):
        cells = {r["D"]: r for r in volume["rows"] if r["model"] == model}
        lines.append(
            row(
                f"Qwen3-{model}",
                *(f"{cells[d]['padded_over_gradient']:.2f}×" for d in ranks),
                *(f"{cells[d]['exact_over_gradient']:.2f}×" for d in ranks),
            )
        )
    misses = [
        f"Qwen3-{r['model']} at {r['D']} ranks moves {r['exact_over_gradient']:.2f}× the gradient (target ≤ 1.1×)"
        for r in volume["rows"]
        if r["exact_over_gradient"] > 1.1
    ]
    return [
        "Elements a data-parallel Muon step hands to its reduce (and again to its broadcast), over the gradient's, "
        f"real Qwen3 shapes, {volume['bucket_elements'] / 1e6:.0f}M-element buckets, α={volume['alpha']:g}: "
        "padded reduce-scatter/all-gather against the exact owner slices DP-Canzona issues:",
        "",
        *lines,
        "",
        missed(misses),
        reproduce(f"bench_canzona.py --layers {load('canzona')['optimizer_step']['layers']}", " (with the step below)"),
    ]


@table("canzona_cost_unit")
def canzona_cost_unit(load: Callable[[str], dict]) -> list[str]:
    units = load("canzona")["cost_units"]
    lines = header(
        "model", "ranks", "α", "flops plan: FLOPs", "numel plan: FLOPs", "flops plan: elements", "numel plan: elements",
        "ideal LPT: FLOPs",
    )  # fmt: skip
    for r in units["rows"]:
        flops, numel = r["units"]["flops"], r["units"]["numel"]
        lines.append(
            row(
                f"Qwen3-{r['model']}",
                r["D"],
                f"{r['alpha']:g}",
                f"{flops['flops_max_over_mean']:.2f}",
                f"{numel['flops_max_over_mean']:.2f}",
                f"{flops['elements_max_over_mean']:.2f}",
                f"{numel['elements_max_over_mean']:.2f}",
                f"{r['ideal_lpt_flops']:.2f}",
            )
        )
    return [
        "Max/mean over ranks of Newton–Schulz FLOPs and of elements, for plans balanced in each cost unit "
        f"(`canzona_cost_unit`; default `{units['default']}`), {units['bucket_elements'] / 1e6:.0f}M-element buckets:",
        "",
        *lines,
        "",
        reproduce(f"bench_canzona.py --layers {load('canzona')['optimizer_step']['layers']}", " (with the step below)"),
    ]


@table("canzona_fsdp")
def canzona_fsdp(load: Callable[[str], dict]) -> list[str]:
    fsdp = load("canzona")["fsdp_step"]
    runs = fsdp["runs"]
    columns = [f"Qwen3-{r['model']}, {r['D']} ranks" for r in runs]
    lines = header("variant", *columns)
    for variant in runs[0]["variants"]:
        lines.append(row(variant, *(f"{r['variants'][variant]['compute_max_s']:.2f}" for r in runs)))
    lines.append(
        row("Canzona: speed-up over redundant", *(f"{r['canzona_speedup_over_redundant']:.2f}×" for r in runs))
    )
    lines.append(
        row("Canzona: speed-up over layer-wise", *(f"{r['canzona_speedup_over_layerwise']:.2f}×" for r in runs))
    )
    lines.append(row("Canzona: critical path / ideal", *(f"{r['canzona_critical_path_over_ideal']:.2f}" for r in runs)))
    misses = [
        f"Canzona on Qwen3-{r['model']} at {r['D']} ranks is {r['canzona_speedup_over_redundant']:.2f}× redundant "
        f"(target {0.8 * r['D']:.1f}×)"
        for r in runs
        if r["canzona_speedup_over_redundant"] < 0.8 * r["D"]
    ]
    return [
        f"Optimizer step on FSDP2 (`fully_shard`), {fsdp['shapes']} ({fsdp['layers']} layers), {fsdp['backend']}; "
        f"critical-path compute per step ({fsdp['compute_clock']}, the slowest rank, s):",
        "",
        *lines,
        "",
        missed(misses),
        reproduce(
            f"bench_canzona.py --layers {load('canzona')['optimizer_step']['layers']} --fsdp-layers {fsdp['layers']}"
        ),
    ]


@table("canzona_real")
def canzona_real(load: Callable[[str], dict]) -> list[str]:
    result = load("canzona")
    real = result["real_shapes_step"]
    rows = real["rows"]
    columns = [f"Qwen3-{r['model']}, {r['D']} ranks" for r in rows]
    lines = header("critical path, s (speed-up over redundant)", *columns)
    lines.append(row("redundant Muon (every rank, every matrix)", *(f"{r['redundant_s']:.2f} (1.00×)" for r in rows)))
    for plan in rows[0]["plans"]:
        cells = [r["plans"][plan] for r in rows]
        lines.append(row(plan, *(f"{c['critical_path_s']:.2f} ({c['speedup_over_redundant']:.2f}×)" for c in cells)))
    lines.append(row("ideal: total / D", *(f"{r['ideal_s']:.2f}" for r in rows)))
    lines += [
        "",
        *header("plan: FLOPs max/mean, elements max/mean, collective volume ÷ gradient (exact; padded)", *columns),
    ]
    for plan in rows[0]["plans"]:
        cells = [r["plans"][plan] for r in rows]
        lines.append(
            row(
                plan,
                *(
                    f"{c['flops_max_over_mean']:.2f}, {c['elements_max_over_mean']:.2f}, "
                    f"{c['exact_over_gradient']:.2f}×; {c['padded_over_gradient']:.2f}×"
                    for c in cells
                ),
            )
        )
    misses = [
        f"Canzona (flops) on Qwen3-{r['model']} at {r['D']} ranks is "
        f"{r['plans']['Canzona α=1, flops']['speedup_over_redundant']:.2f}× redundant (target {0.8 * r['D']:.1f}×)"
        for r in rows
        if r["plans"]["Canzona α=1, flops"]["speedup_over_redundant"] < 0.8 * r["D"]
    ]
    return [
        f"Optimizer step on one full-size layer of each model ({real['bucket_elements'] / 1e6:.0f}M-element buckets): "
        f"each distinct matrix's Muon update timed once ({real['compute_clock']}) with {real['ns_steps']} "
        "Newton–Schulz iteration instead of 5, as five on full-size matrices on every rank of the redundant baseline "
        "do not fit this 2-core machine; a plan's critical path is its busiest rank's sum of those times "
        f"(load average {result['machine']['load_average_1m']}):",
        "",
        *lines,
        "",
        "Redundant Muon on FSDP2 all-gathers every full gradient into every rank (1.00× the gradient into each, "
        "D× in all); the owner plans move each gradient element once to its owner and the update once back. "
        "With a single layer, Megatron's assignment of whole layers would give one rank everything (the redundant "
        "time); the layer-wise row is its per-matrix ping-pong variant.",
        missed(misses),
        reproduce(
            f"bench_canzona.py --layers {result['optimizer_step']['layers']} --fsdp-layers {result['fsdp_step']['layers']}"
        ),
    ]


@table("memory")
def memory(load: Callable[[str], dict]) -> list[str]:
    result = load("memory")
    lines = header("D", "path", "shard state (16 B × N / D)", "init peak (÷ shard state)", "step peak (÷ shard state)")
    for r in result["rows"]:
        lines.append(
            row(
                r["D"],
                "meta-device build" if r["path"] == "new" else "whole model, then sharded",
                f"{r['shard_state_bytes'] / 2**30:.2f} GiB",
                f"{r['init_peak_bytes'] / 2**30:.2f} GiB ({r['init_over_shard_state']:.2f}×)",
                f"{r['step_peak_bytes'] / 2**30:.2f} GiB ({r['step_over_shard_state']:.2f}×)",
            )
        )
    misses = [
        f"init peak at D={r['D']} ({r['path']} path) is {r['init_over_shard_state']:.2f}× its shard state (target ≤ 1.3×)"
        for r in result["rows"]
        if r["path"] == "new" and r["init_over_shard_state"] > 1.3
    ]
    return [
        f"{result['model']} ({result['parameters'] / 1e6:.0f}M parameters), {result['backend']}, "
        f"{result['steps']} steps of {result['batch'][0]}×{result['batch'][1]} tokens; {result['measure']} "
        f"(load average {result['machine']['load_average_1m']} on the 2 cores). The jobs' path (meta-device build) "
        "beside the old one, which built the whole model on every rank before sharding it:",
        "",
        *lines,
        "",
        missed(misses),
        reproduce("bench_memory.py"),
    ]


@table("throughput")
def throughput(load: Callable[[str], dict]) -> list[str]:
    result = load("throughput")
    rows = result["rows"]
    lines = header(
        "variant", *(f"{r['D']} ranks: mesh" for r in rows), *(f"{r['D']} ranks: tokens/s (÷ DDP)" for r in rows)
    )
    for variant in rows[0]["tokens_per_s"]:
        lines.append(
            row(
                variant,
                *(r["meshes"][variant] for r in rows),
                *(f"{r['tokens_per_s'][variant]:.0f} ({r['over_ddp'][variant]:.2f}×)" for r in rows),
            )
        )
    batch, seq = result["global_batch"]
    return [
        f"Training tokens/s of {result['model']}, {result['backend']}, global batch {batch}×{seq} tokens split over the "
        f"data-parallel ranks, median of {result['trials']} interleaved trials of {result['steps_per_trial']} steps "
        f"(load average {result['machine']['load_average_1m']} on the 2 shared CPU cores):",
        "",
        *lines,
        "",
        "These are CPU processes sharing 2 cores, on a model of 0.16M parameters: communication and Python overhead "
        "dominate, so the ratios are what the sharding costs here, not what it gains on GPUs; the GPU numbers "
        "are in the next table.",
        reproduce("bench_throughput.py", quick=result["quick"]),
    ]


GASLOC_METHODS = {
    "allreduce": "all-reduce",
    "diloco": "DiLoCo",
    "gasloc-ring": "GASLoC ring",
    "gasloc-one-peer": "GASLoC one-peer",
    "gossip-ring": "plain gossip",
    "isolated": "isolated",
}


@table("gpu")
def gpu(load: Callable[[str], dict]) -> list[str]:
    mfu, job = load("gpu_mfu"), load("gpu_job")
    parameters = mfu["parameters_without_embedding"] / 1e9
    batch, seq = mfu["batch_per_rank"]
    on_gpu, on_cpu = job["gpu"], job["cpu"]
    model, steps = job["job"]["model"], job["job"]["steps"]
    return [
        f"On one {mfu['device']} (torch {mfu['machine']['torch']}, {mfu['machine']['cpus']} CPU cores), a "
        f"{parameters:.2f}B-parameter Llama-shaped decoder trained with the trainer's own FSDP2 in bf16, "
        f"{batch}×{seq} tokens a step, ran {mfu['tokens_per_s']:,.0f} tokens/s: "
        f"**MFU {100 * mfu['mfu']:.1f}%** of the datasheet's {mfu['peak_tflops_per_device']} TFLOP/s "
        f"(peak memory {mfu['peak_memory_gib']:.1f} GiB; no `torch.compile`, no fused kernels).",
        "",
        f"The same {model} job through the platform (server, tenant, SDK, a forked worker), once with "
        "`gpus_per_worker=1` and once on the node's CPUs:",
        "",
        *header("job", "worker's log", "submit → first step", "tokens/s", "validation loss"),
        *(
            row(
                f"{name} ({steps[key]} steps)",
                f"`{r['device_log'][0].split('cantata.worker: ')[-1]}`",
                f"{r['submit_to_first_step_s']:.2f} s",
                f"{r['tokens_per_s_median']:,.0f}",
                f"{r['val_loss']:.3f}",
            )
            for name, key, r in (("GPU", "gpu", on_gpu), ("CPU", "cpu", on_cpu))
        ),
        "",
        f"GPU ÷ CPU: {job['tokens_per_s_gpu_over_cpu']}× the tokens/s; the first step takes "
        f"{job['first_step_gpu_over_cpu']}× as long (CUDA's start-up). The GPU job's checkpoint, downloaded "
        f"through the SDK, loads on the CPU ({job['gpu_checkpoint_loaded_on_cpu_tensors']} tensors). One GPU "
        "cannot hold a 2-worker NCCL group (NCCL refuses two ranks on one device), so the 2-worker NCCL job "
        "is still unmeasured.",
        reproduce(
            "gpu_job.py",
            " and `.venv/bin/python benchmarks/gpu_mfu.py` on a GPU machine (`--check` runs either on the CPU)",
        ),
    ]


@table("gasloc")
def gasloc(load: Callable[[str], dict]) -> list[str]:
    result = load("gasloc")
    rows = {(r["H"], r["method"]): r for r in result["rows"]}
    hs = sorted({h for h, _ in rows})
    lines = header("H", *GASLOC_METHODS.values())
    for h in hs:
        lines.append(
            row(
                h,
                *(
                    f"{rows[h, m]['val_loss_mean']:.3f} ± {rows[h, m]['val_loss_std']:.3f}" if (h, m) in rows else ""
                    for m in GASLOC_METHODS
                ),
            )
        )
    return [
        f"{result['workers']} workers simulated in one process (training only, no network) on "
        f"`builtin:{result['corpus']}`, {result['steps']} inner steps, {result['seeds']} seeds: validation loss "
        "(mean ± std):",
        "",
        *lines,
        "",
        reproduce("bench_gasloc.py", quick=result.get("quick", False)),
    ]


BANDWIDTH_METHODS = {
    "diloco": "DiLoCo (streamed all-reduce)",
    "gasloc-ring": "GASLoC ring",
    "gasloc-one-peer": "GASLoC one-peer",
    "gasloc-two-peer": "GASLoC two-peer",
}
BANDWIDTH_SCENARIOS = {
    "control": "control (no shaping)",
    "slow-nic": "one slow NIC",
    "wan": "WAN latency",
    "slow-all": "every NIC slow",
}


def spread(stat: dict, digits: int, unit: str = "") -> str:
    """A mean over seeds with its range, as ``mean [min–max]``."""
    if not stat:
        return "–"
    return f"{stat['mean']:.{digits}f}{unit} [{stat['min']:.{digits}f}–{stat['max']:.{digits}f}]"


def bandwidth_setup(result: dict) -> str:
    setup = result["setup"]
    loads = {
        BANDWIDTH_SCENARIOS[k]: [r["load_average_1m"] for r in result["runs"] if r["scenario"] == k]
        for k in BANDWIDTH_SCENARIOS
    }
    return (
        f"{setup['workers']} worker processes, each in its own network namespace with one veth NIC; the platform's "
        f"mutual-TLS gossip transport, `{setup['model']}` ({setup['parameters'] / 1e3:.0f}k parameters), "
        f"{setup['rounds']} rounds of H={setup['local_steps']}, {setup['seeds']} seeds. Shaping (`tc htb`, egress "
        f"and ingress of the NIC): control none; one slow NIC: worker 0 at {setup['slow_mbit'] / 8:g} MB/s, the "
        f"others at {setup['fast_mbit'] / 8:g} MB/s; WAN latency: every NIC at {setup['fast_mbit'] / 8:g} MB/s "
        f"with {setup['delay_ms']:g} ms each way (RTT {2 * setup['delay_ms']:g} ms) from "
        f"{setup.get('wan_delay', 'netem')}; every NIC slow: all at {setup['slow_mbit'] / 8:g} MB/s. "
        "Wall-clock is the slowest worker's rounds plus the final consensus all-reduce (the model the user gets); "
        "loss is that consensus's validation loss after the last round (equal rounds) and at the wall-clock of the "
        f"seed's fastest method (equal wall-clock). Each cell: mean [min–max] over seeds; {setup['significance']} "
        "(marked ≠, else ≈ DiLoCo). Load average over each scenario's runs on the development machine's 2 shared "
        "cores: "
        + ", ".join(f"{k} {min(v):.1f}–{max(v):.1f}" for k, v in loads.items() if v)
        + " (so compare methods within a scenario, not scenarios with each other)."
        + "".join(f" Not run: {BANDWIDTH_SCENARIOS[k]} ({why})." for k, why in result.get("not_run", {}).items())
    )


def versus(r: dict, key: str) -> str:
    return "≠" if r[key] else "≈"


@table("gasloc_bandwidth")
def gasloc_bandwidth(load: Callable[[str], dict]) -> list[str]:
    result = load("gasloc_bandwidth")
    setup = result["setup"]
    lines = header(
        "scenario", "method", "wall-clock with consensus", "of it consensus", "DiLoCo's over it",
        "loss at equal wall-clock", "loss at equal rounds", "MB sent per worker",
    )  # fmt: skip
    for scenario, label in BANDWIDTH_SCENARIOS.items():
        for method, name in BANDWIDTH_METHODS.items():
            r = next((r for r in result["rows"] if r["scenario"] == scenario and r["method"] == method), None)
            if r is None:
                continue
            diloco = method == "diloco"
            lines.append(
                row(
                    label,
                    name,
                    spread(r["seconds"], 2, " s"),
                    f"{r['consensus_seconds']['mean']:.2f} s",
                    "1.00×" if diloco else f"{r['speedup_over_diloco']:.2f}× {versus(r, 'time_differs')}",
                    spread(r["loss_at_equal_time"], 3)
                    + ("" if diloco else f" {versus(r, 'loss_at_equal_time_differs')}"),
                    spread(r["loss_at_equal_rounds"], 3)
                    + ("" if diloco else f" {versus(r, 'loss_at_equal_rounds_differs')}"),
                    f"{r['mb_sent_per_worker']:.2f}",
                )
            )
    return [
        bandwidth_setup(result),
        "",
        *lines,
        "",
        "Consensus loss against wall-clock: `benchmarks/results/bench_gasloc_bandwidth.png`.",
        reproduce(
            f"bench_gasloc_bandwidth.py --workers {setup['workers']} --seeds {setup['seeds']} --rounds "
            f"{setup['rounds']} --local-steps {setup['local_steps']} --eval-every {setup['eval_every']} "
            f"--methods {' '.join(setup['methods'])} --fast-mbit {setup['fast_mbit']} --slow-mbit "
            f"{setup['slow_mbit']} --delay-ms {setup['delay_ms']:g}",
            f" as root (about {result['minutes']:.0f} min)",
            quick=result.get("quick", False),
        ),
    ]


def gasloc_verdict(r: dict, base: dict) -> str:
    """One GASLoC variant against DiLoCo in one scenario, by the significance rule: wall-clock, then loss."""
    speed = r["speedup_over_diloco"]
    if r["time_differs"]:
        time = f"{'faster' if speed > 1 else 'slower'} ({speed:.2f}× DiLoCo's speed)"
    else:
        time = f"no faster or slower ({speed:.2f}×, within noise)"
    loss, ref = r["loss_at_equal_time"], base["loss_at_equal_time"]
    if not loss or not ref:
        return time
    if r["loss_at_equal_time_differs"]:
        better = "better" if loss["mean"] < ref["mean"] else "worse"
        return f"{time}, {better} loss at equal wall-clock ({loss['mean']:.3f} vs {ref['mean']:.3f})"
    return f"{time}, equal loss at equal wall-clock within noise"


@readme_table("gasloc_summary")
def gasloc_summary(load: Callable[[str], dict]) -> list[str]:
    """One paragraph: what each GASLoC topology gains or loses against DiLoCo, per scenario."""
    result = load("gasloc_bandwidth")
    rows, setup = result["rows"], result["setup"]
    scenarios = []
    for scenario, label in BANDWIDTH_SCENARIOS.items():
        base = next((r for r in rows if r["scenario"] == scenario and r["method"] == "diloco"), None)
        mine = [r for r in rows if r["scenario"] == scenario and r["method"] != "diloco"]
        if base is not None and mine:
            verdicts = "; ".join(
                f"{BANDWIDTH_METHODS[r['method']].removeprefix('GASLoC ')} {gasloc_verdict(r, base)}" for r in mine
            )
            scenarios.append(f"{label}: {verdicts}")
    not_run = "".join(f" Not run: {BANDWIDTH_SCENARIOS[k]} ({why})." for k, why in result.get("not_run", {}).items())
    return [
        f"**GASLoC against DiLoCo** on a real shaped network ({setup['workers']} workers, `{setup['model']}`, "
        f"{setup['seeds']} seeds; DiLoCo on the platform's streamed all-reduce; wall-clock includes the final "
        "consensus, loss is the consensus model's; a difference counts only when the seeds' ranges do not overlap; "
        "[table](docs/benchmarks.md#gasloc-and-diloco)). "
        + ". ".join(s[0].upper() + s[1:] for s in scenarios)
        + "."
        + not_run
    ]


@table("allreduce")
def allreduce(load: Callable[[str], dict]) -> list[str]:
    result = load("allreduce")
    lines = header("workers", "vector", "streamed (platform)", "swap ring (before)", "ring over streamed",
                   "streamed per-worker goodput")  # fmt: skip
    rows = result["rows"]
    for streamed in (r for r in rows if r["method"] == "streamed"):
        ring = next(
            r
            for r in rows
            if r["method"] == "ring" and (r["workers"], r["size_mib"]) == (streamed["workers"], streamed["size_mib"])
        )
        lines.append(
            row(
                streamed["workers"],
                size(streamed["size_mib"]),
                f"{streamed['median_s'] * 1e3:.0f} ms [{streamed['min_s'] * 1e3:.0f}–{streamed['max_s'] * 1e3:.0f}]",
                f"{ring['median_s'] * 1e3:.0f} ms [{ring['min_s'] * 1e3:.0f}–{ring['max_s'] * 1e3:.0f}]",
                f"{streamed['ring_over_streamed']:.2f}×",
                f"{streamed['goodput_mb_per_s']:.0f} MB/s",
            )
        )
    trials = rows[0]["trials"]
    return [
        "n worker processes on loopback, each with its own mutual-TLS `GossipNode`, sum a float32 vector; the time "
        "is the slowest worker's from a common barrier, median [min–max] over "
        f"{trials} interleaved trials, on the development machine's {result['machine']['cpus']} shared cores (load "
        f"average {result['machine']['load_average_1m']:g} at the end). Both send 2(n−1)/n of the vector per worker; "
        f"goodput is that over the median. Failed all-reduces: {sum(r.get('failed', 0) for r in rows)}.",
        "",
        *lines,
        "",
        reproduce("bench_allreduce.py", quick=result.get("quick", False)),
    ]


@table("gossip_transport")
def gossip_transport(load: Callable[[str], dict]) -> list[str]:
    result = load("gossip_transport")
    rows = {(r["transport"], r["size_mib"]): r for r in result["rows"]}
    sizes = sorted({s for _, s in rows})
    lines = header(
        "parameter set", "mTLS gRPC GB/s", "raw mTLS GB/s", "ratio", "raw TCP GB/s", "extra peak memory / size",
    )  # fmt: skip
    misses = []
    for size_mib in sizes:
        grpc, raw = rows["mtls_grpc", size_mib], rows["raw_mtls", size_mib]
        ratio = grpc["ratio_vs_raw_mtls"]
        if ratio < 0.8:
            misses.append(f"{ratio:.2f}× the raw mTLS socket at {size(size_mib)} (target ≥ 0.8×)")
        if grpc["extra_peak_over_size"] > 2:
            misses.append(f"extra peak memory {grpc['extra_peak_over_size']:.2f}× at {size(size_mib)} (target ≤ 2×)")
        lines.append(
            row(
                size(size_mib),
                f"{grpc['gb_per_s']:.2f}",
                f"{raw['gb_per_s']:.2f}",
                f"{ratio:.2f}×",
                f"{rows['raw_tcp', size_mib]['gb_per_s']:.2f}" if ("raw_tcp", size_mib) in rows else "",
                f"{grpc['extra_peak_over_size']:.2f}×",
            )
        )
    return [
        "Two processes swap a parameter set on loopback (throughput per direction, best of "
        f"{result['trials']} interleaved trials of {result['repeats']} exchanges):",
        "",
        *lines,
        "",
        missed(misses),
        reproduce("bench_gossip_transport.py", quick=result["quick"]),
    ]


@table("sharded_gossip")
def sharded_gossip(load: Callable[[str], dict]) -> list[str]:
    result = load("sharded_gossip")
    lines = header("model", "path", "MB sent a round (busiest rank)", "outer round s (median)", "sharded ÷ gathered")
    for r in result["rows"]:
        for path in ("gathered", "sharded"):
            part = r[path]
            ratio = (
                f"{r['bytes_ratio']:.3f}× the bytes, {r['round_time_ratio']:.2f}× the time" if path == "sharded" else ""
            )
            lines.append(
                row(r["model"], path, f"{part['max_bytes_per_rank'] / 1e6:.1f}", f"{part['round_s_median']:.3f}", ratio)
            )
    return [
        f"A GASLoC ring of {result['groups']} worker groups × {result['ranks']} ranks over real mutual-TLS gossip: "
        "every rank gossiping its own FSDP2 shard (sharded) against the group's rank 0 gossiping the gathered "
        f"model (gathered), {result['rounds']} rounds, median of {result['trials']} trials (load average "
        f"{result['machine']['load_average_1m']:g} on {result['machine']['cpus']} cores, so the times are rough):",
        "",
        *lines,
        "",
        reproduce(f"bench_sharded_gossip.py --trials {result['trials']}", quick=result["quick"]),
    ]


PANEL_NAMES = {"ring": "ring, 1 Byzantine", "complete": "complete, 2 Byzantine"}


def _spread(summary: dict) -> str:
    """``mean ± std`` of a cell's final validation losses, or how many seeds diverged."""
    if summary["mean"] is None:
        return f"diverged ({summary['diverged']} of {len(summary['val_loss'])} seeds)"
    digits = ".3g" if summary["mean"] >= 1000 else ".3f"  # a run blown far off
    return f"{summary['mean']:{digits}} ± {summary['std']:{digits}}"


def _anomaly_setup(result: dict) -> str:
    scale, job, machine = result["scale"], result["job"], result["machine"]
    return (
        f"{scale['workers']} GASLoC workers of the product's `{job['model']}` (`trainer/model.py`) on the built-in "
        f"corpus: the first {scale['rounds']} rounds of {job['local_steps']} local steps (batch {job['batch_size']}, "
        f"sequences of {job['seq_len']}) of a {job['steps']}-step job, every other setting the server's default "
        f"({job['optimizer']} at lr {job['lr']:g}, weight decay {job['weight_decay']:g}, {job['lr_schedule']} "
        f"schedule, outer lr {job['outer_lr']:g}, outer momentum {job['outer_momentum']:g}) and the workers' own "
        f"screening settings (`layer_min_spread` {result['screening']['layer_min_spread']:g}, quarantine after "
        f"{result['quarantine']['rejections']} rejections in {result['quarantine']['window']} rounds); seeds "
        f"{', '.join(map(str, result['seeds']))}, on {result['device']} ({machine['cpus']} cores), torch "
        f"{result['torch']}. Final validation loss of the honest workers' models, mean ± standard deviation over the seeds"
    )


@table("anomaly_search")
def anomaly_search(load: Callable[[str], dict]) -> list[str]:
    """Phase 1 of bench_anomaly: every attack setting tried, undefended, against the clean runs."""
    result = load("anomaly")
    panels = list(result["panels"])
    clean = {r["topology"]: r for r in result["rows"] if r["attack"] == "clean"}
    lines = header("attack", "setting", *(PANEL_NAMES.get(p, p) for p in panels))
    lines.append(row("clean", "", *(_spread(clean[p]["undefended"]) for p in panels)))
    cells = {(r["attack"], r["setting"], r["topology"]): r for r in result["search"]}
    for attack, setting in dict.fromkeys((r["attack"], r["setting"]) for r in result["search"]):
        found = [cells.get((attack, setting, p)) for p in panels]
        lines.append(
            row(
                attack.replace("_", " "),
                setting,
                *("" if r is None else _spread(r) + (" **hurts**" if r["hurts"] else "") for r in found),
            )
        )
    return [
        _anomaly_setup(result) + ", undefended. A setting **hurts** when every seed ends above the highest clean "
        "loss (a diverged run counts as above); each attack keeps its first setting that hurts, in the order "
        "below, or its last if none does:",
        "",
        *lines,
        "",
        reproduce(
            "bench_anomaly.py",
            f" (about {result['wall_seconds'] / 60:.0f} min with the table below, "
            f"at a load average of {result['machine']['load_average_1m']:g} on {result['machine']['cpus']} cores)",
        ),
    ]


@table("anomaly")
def anomaly(load: Callable[[str], dict]) -> list[str]:
    """Phase 2 of bench_anomaly: each attack at its kept setting, undefended and screened, with TPR and FPR."""
    result = load("anomaly")
    lines = header("graph", "attack", "setting", "undefended", "screened", "TPR", "FPR")
    harmless = []
    for r in result["rows"]:
        if r["hurts"] is False:
            harmless.append(f"{r['attack'].replace('_', ' ')} ({r['topology']})")
        tpr = "–" if r["tpr"] is None else f"{r['tpr']:.2f}"
        fpr = "–" if r["fpr"] is None else f"{r['fpr']:.3f}"
        setting = r["setting"] + (" (no harm found)" if r["hurts"] is False else "")
        lines.append(
            row(
                PANEL_NAMES.get(r["topology"], r["topology"]),
                r["attack"].replace("_", " "),
                setting,
                _spread(r["undefended"]),
                _spread(r["screened"]),
                tpr,
                fpr,
            )
        )
    found = (
        f"No setting tried hurts undefended for: {', '.join(harmless)}; their rows run the strongest setting tried, "
        "so their TPR is the detection of a change that does no measurable harm."
        if harmless
        else "Every attack has a setting that hurts undefended."
    )
    return [
        _anomaly_setup(result) + ". Each attack at its kept setting, undefended and screened (the workers' "
        "`UpdateScreen`); TPR: the share of Byzantine messages the screen kept out of the mix (rejected, or from a "
        "quarantined peer), FPR: the same for honest messages:",
        "",
        *lines,
        "",
        found,
        f"Screening took {100 * result['screening_overhead']:.1f}% of the screened runs' round time.",
        reproduce("bench_anomaly.py", " (the search above and this table, one run)"),
    ]


CHECKPOINT_STORES = {"local": "local disk", "s3": "S3 (moto)", "azure": "Azure (Azurite)"}


@table("checkpoint")
def checkpoint(load: Callable[[str], dict]) -> list[str]:
    result = load("checkpoint")
    cases = {(c["store"], c["mode"]): c for c in result["cases"]}
    ratios = result["sealed_over_plaintext"]
    lines = header(
        "store", "save MB/s plain", "save MB/s sealed", "ratio", "load MB/s plain", "load MB/s sealed", "ratio"
    )
    for store, label in CHECKPOINT_STORES.items():
        plain, sealed = cases[store, "plaintext"], cases[store, "sealed"]
        lines.append(
            row(
                label,
                f"{plain['save_mb_s']:.0f}",
                f"{sealed['save_mb_s']:.0f}",
                f"{ratios[store]['save']:.2f}×",
                f"{plain['load_mb_s']:.0f}",
                f"{sealed['load_mb_s']:.0f}",
                f"{ratios[store]['load']:.2f}×",
            )
        )
    misses = [
        f"sealed {op} on local disk at {ratios['local'][op]:.2f}× plaintext (target ≥ 0.85×)"
        for op in ("save", "load")
        if ratios["local"][op] < 0.85
    ]
    stream = result["stream_seal"]
    return [
        f"A {size(result['state_size_mib'])} state saved and loaded sealed and plaintext, best of "
        f"{result['repeat']} alternating runs per case:",
        "",
        *lines,
        "",
        f"Streaming {size(stream['size_mib'])} through the encryptor into the local store: "
        f"{stream['mb_s']:.0f} MB/s, peak memory {stream['peak_rss_above_baseline_mib']:.1f} MiB above the baseline.",
        missed(misses),
        reproduce(f"bench_checkpoint.py --repeat {result['repeat']}", quick=result["quick"]),
        "",
        *_sealed_vs_plain(load("sealed_vs_plain")),
    ]


SEALED_BASELINES = {"sealed": ("one object: torch.save / torch.load", "torch"), "sealed_dcp": ("sharded: DCP", "dcp")}


def _sealed_vs_plain(result: dict) -> list[str]:
    """Sealed against plain DCP and plain torch.save/torch.load on the same disk (targets: load ≥ 0.8×, save ≥ 0.9×)."""
    cases, ratios = result["cases"], result["sealed_over_plain"]
    lines = header(
        "format", "save s plain / sealed", "save ratio (trials)", "load s plain / sealed", "load ratio (trials)"
    )
    misses = []
    for sealed, (label, plain) in SEALED_BASELINES.items():
        cells = []
        for op, target in (("save", 0.9), ("load", 0.8)):
            ratio = ratios[sealed][op]
            trials = ratio["per_trial"]
            cells += [
                f"{cases[plain][op]['median']:.2f} / {cases[sealed][op]['median']:.2f}",
                f"{ratio['of_medians']:.2f}× ({trials['min']:.2f}–{trials['max']:.2f})",
            ]
            if ratio["of_medians"] < target:
                misses.append(f"sealed {label} {op} at {ratio['of_medians']:.2f}× plain (target ≥ {target}×)")
        lines.append(row(label, *cells))
    machine = result["machine"]
    return [
        f"Against plain checkpoints on the same disk ({size(result['state_size_mib'])} state, median of "
        f"{result['trials']} interleaved trials, each in a fresh process; ratio: sealed throughput over plain, "
        f"of the medians, with the range of the per-trial ratios; load average {machine['load_average_1m']:g} "
        f"on {machine['cpus']} CPUs):",
        "",
        *lines,
        "",
        missed(misses),
        reproduce(f"bench_sealed_vs_plain.py --trials {result['trials']}", quick=result["quick"]),
    ]


@table("sharded_checkpoint")
def sharded_checkpoint(load: Callable[[str], dict]) -> list[str]:
    result = load("sharded_checkpoint")
    lines = header("format", "checkpoint s (slowest rank)", "sealed MB per rank", "load s")
    for case, label in (
        ("gathered", "full tensors gathered, sealed by rank 0"),
        ("sharded", "sharded: DCP, every rank its own"),
    ):
        part = result[case]
        per_rank = " / ".join(f"{b / 1e6:.1f}" for b in part["sealed_bytes_per_rank"])
        lines.append(row(label, f"{part['save_s']:.2f}", per_rank, f"{part['load_s']:.2f}"))
    return [
        f"A {result['parameters'] / 1e6:.1f}M-parameter decoder with its AdamW state on {result['world']} gloo "
        f"processes ({result['mesh']}), median of {result['trials']} interleaved trials, load average "
        f"{result['machine']['load_average_1m']:g} on {result['machine']['cpus']} CPUs:",
        "",
        *lines,
        "",
        f"Gathered over sharded: {result['ratio_save_gathered_over_sharded']:.2f}× the checkpoint time, "
        f"{result['ratio_load_gathered_over_sharded']:.2f}× the load time.",
        reproduce(f"bench_sharded_checkpoint.py --trials {result['trials']}", quick=result["quick"]),
    ]


@table("async_checkpoint")
def async_checkpoint(load: Callable[[str], dict]) -> list[str]:
    result = load("async_checkpoint")
    lines = header("save", "training stalled per save, s", "step between saves, s", "run, s")
    for mode, label in (("sync", "synchronous"), ("async", "asynchronous (`async_checkpoint`)")):
        numbers = result["modes"][mode]
        lines.append(row(label, f"{numbers['stall_s']:.3f}", f"{numbers['step_s']:.3f}", f"{numbers['wall_s']:.2f}"))
    return [
        f"{result['parameters_mib']:.0f} MiB of parameters with their AdamW state, sealed into a local store every "
        f"{result['every']} of {result['steps']} steps, median of {result['trials']} interleaved trials, load average "
        f"{result['machine']['load_average_1m']:g} on {result['machine']['cpus']} CPUs:",
        "",
        *lines,
        "",
        f"Synchronous over asynchronous: {result['stall_ratio_sync_over_async']:.1f}× the stall of a save.",
        reproduce(f"bench_async_checkpoint.py --trials {result['trials']}", quick=result["quick"]),
    ]


@table("audit")
def audit(load: Callable[[str], dict]) -> list[str]:
    result = load("audit")
    parts = (
        ("append, fsync at each checkpoint", result["append"]["at_checkpoint"]),
        ("append, fsync per record", result["append"]["each_record"]),
        ("verify (chain, canonical form, signatures)", result["verify"]),
    )
    lines = header("operation", "records", "audit log records/s", "plain JSONL records/s", "ratio")
    for label, part in parts:
        lines.append(
            row(
                label,
                f"{part['records']:,}",
                f"{part['audit_records_per_s']:,}",
                f"{part['plain_records_per_s']:,}",
                f"{part['audit_over_plain']:.2f}×",
            )
        )
    per_record = result["bytes_per_record"]
    return [
        "The audit log next to a plain unsigned JSONL file on the same disk, the two taking turns (median):",
        "",
        *lines,
        "",
        f"A record takes {per_record['audit']:.0f} bytes in the log ({per_record['plain']:.0f} as plain JSONL).",
        reproduce("bench_audit.py", quick=result["quick"]),
    ]


@table("control_plane")
def control_plane(load: Callable[[str], dict]) -> list[str]:
    result = load("control_plane")
    unary, watch, targets, measured = result["unary"], result["watchers"], result["targets"], result["measured"]
    lines = header("path", "callers", "Cantata", "bare echo", "ratio", "target")
    for callers in ("1", "16"):
        for name, label, limit in (("get_job", "`GetJob`", "echo"), ("submit", "`SubmitJob`", "echo_for_submit")):
            ours, theirs = unary[callers][name], unary[callers][limit]
            target = f"≥ {targets['get_job_16' if name == 'get_job' else 'submit_16']}×" if callers == "16" else ""
            lines.append(
                row(
                    label,
                    callers,
                    f"{ours['calls_per_s']:,.0f}/s (p50 {ours['p50_ms']} ms, p99 {ours['p99_ms']} ms)",
                    f"{theirs['calls_per_s']:,.0f}/s (p50 {theirs['p50_ms']} ms, p99 {theirs['p99_ms']} ms)",
                    f"{ours['calls_per_s'] / theirs['calls_per_s']:.2f}×",
                    target,
                )
            )
    ours, theirs = watch["cantata"], watch["echo"]
    lines.append(
        row(
            f"{ours['watchers']:,} watchers, one event to all",
            ours["watchers"],
            f"p50 {ours['fanout_p50_ms']} ms, p99 {ours['fanout_p99_ms']} ms; "
            f"{ours['rss_mib_held'] - ours['rss_mib_before']:.0f} MiB, {ours['threads_held']} threads",
            f"p50 {theirs['fanout_p50_ms']} ms, p99 {theirs['fanout_p99_ms']} ms; "
            f"{theirs['rss_mib_held'] - theirs['rss_mib_before']:.0f} MiB, {theirs['threads_held']} threads",
            "",
            f"p99 ≤ {targets['fanout_p99_ms']:.0f} ms",
        )
    )
    for threads, part in result["audit"].items():
        lines.append(
            row(
                "durable audit appends",
                threads,
                f"{part['audit_per_s']:,}/s",
                f"{part['limit_per_s']:,}/s (group-commit loop)",
                f"{part['ratio']:.2f}×",
                f"≥ {targets['audit_appends']}×" if threads != "1" else "",
            )
        )
    empty, queued = result["queue"]["empty"], result["queue"]["queued"]
    misses = []
    if measured["submit_16"] < targets["submit_16"]:
        misses.append(f"submit at 16 callers {measured['submit_16']:.2f}× echo (target {targets['submit_16']}×)")
    if measured["get_job_16"] < targets["get_job_16"]:
        misses.append(f"`GetJob` at 16 callers {measured['get_job_16']:.2f}× echo (target {targets['get_job_16']}×)")
    if measured["fanout_p99_ms"] > targets["fanout_p99_ms"]:
        misses.append(f"fan-out p99 {measured['fanout_p99_ms']} ms (target {targets['fanout_p99_ms']:.0f} ms)")
    if measured["audit_appends"] < targets["audit_appends"]:
        misses.append(
            f"durable audit appends {measured['audit_appends']:.2f}× the limit (target {targets['audit_appends']}×)"
        )
    return [
        "A real server (no worker slots) next to a bare asyncio gRPC echo server on the same mutual-TLS "
        "certificates, and the audit log next to a bare `fdatasync` group-commit loop, taking turns (median, "
        f"machine load average {result['machine']['load_average_1m']} on {result['machine']['cpus']} cores):",
        "",
        *lines,
        "",
        f"Idle server: {empty['idle_cpu_percent']}% CPU with an empty queue, {queued['idle_cpu_percent']}% with "
        f"{queued['queued']:,} queued jobs ({queued['rss_mib']:.0f} MiB resident)"
        + (
            f" in the first window after start (the scheduler's one-time verdict on each job), "
            f"{queued['idle_cpu_percent_later']}% in the next"
            if "idle_cpu_percent_later" in queued
            else ""
        )
        + f"; the scheduler's look at the queue's head takes {queued['queue_head_ms']} ms with them "
        f"({empty['queue_head_ms']} ms empty).",
        missed(misses),
        reproduce("bench_control_plane.py", quick=result["quick"]),
    ]


FLOOD_ROWS = {
    "control": "no flood (control)",
    "flood": "flood",
    "distributed_flood_open_connection": "flood from more addresses, admin connected beforehand",
}


@table("flood")
def flood(load: Callable[[str], dict]) -> list[str]:
    result = load("flood")
    ports = ("grpc", "enrollment", "dashboard", "metrics")
    lines = header(
        "run", "connections opened (addresses)", "`ListTenants` median / max", "held: " + "/".join(ports), "RSS"
    )
    for key, label in FLOOD_ROWS.items():
        r = result["rows"][key]
        calls = r["list_tenants"]
        lines.append(
            row(
                label,
                f"{r['flood_connections_opened']:,} ({r['flood_sources']})" if "flood_sources" in r else "",
                f"{1000 * calls['median_s']:.1f} / {1000 * calls['max_s']:.1f} ms",
                "/".join(str(r["connections_held"][p]) for p in ports),
                f"{r['rss_mib']:.1f} MiB",
            )
        )
    caps = result["caps"]
    return [
        "A real server flooded with connections from several addresses, beside "
        f"a no-flood control (caps: {caps['max_connections']:,} connections a port, "
        f"{caps['max_connections_per_address']} per address, {caps['http_max_connections']} on each HTTP port; "
        f"load average {result['machine']['load_average_1m']:g} on {result['machine']['cpus']} cores):",
        "",
        *lines,
        "",
        f"Under the flood `ListTenants` took {result['list_tenants_ratio_flood_to_control']}× the control's median "
        f"and the server's RSS was {result['rss_ratio_flood_to_control']}× the control's.",
        missed([] if result["meets_target"] else [f"`ListTenants` within {result['target_list_tenants_s']:g} s"]),
        reproduce("bench_flood.py", quick=result["quick"]),
    ]


@table("audit_lookup")
def audit_lookup(load: Callable[[str], dict]) -> list[str]:
    result = load("audit_lookup")
    lines = header("query (one page of at most 100)", "matches", "lookup s", "parse-all s", "speedup")
    for label, q in result["queries"].items():
        lines.append(row(label, q["matches"], f"{q['lookup_s']:.2f}", f"{q['baseline_s']:.2f}", f"{q['speedup']:.1f}×"))
    return [
        f"`cantata audit events` over a log of {result['records']:,} records "
        f"({result['log_bytes'] / 2**20:.0f} MiB), next to parsing every record and filtering, "
        f"the two taking turns (median of {result['rounds']}, machine load average "
        f"{result['machine']['load_average_1m']}):",
        "",
        *lines,
        "",
        reproduce("bench_audit_lookup.py", quick=result["quick"]),
    ]


LOADER_STORES = {"local": "local", "s3 (moto)": "S3 (moto)", "azure (azurite)": "Azure (Azurite)"}


@table("dataloader")
def dataloader(load: Callable[[str], dict]) -> list[str]:
    result = load("dataloader")
    waits = result["gpt_tiny"]["training_runs"]
    lines = header(
        "store", "form", "plain read", "loader 32×1024", "ratio", "loader 16×64", "ratio", "gpt-tiny data wait"
    )

    def both(r: dict, shape: str) -> str:
        ratio = f"{r[f'ratio_{shape}']:.2f}×"
        return f"{ratio} / {r[f'ratio_vs_read_unseal_{shape}']:.2f}×" if r["form"] == "encrypted" else ratio

    slow, misses = [], []
    for r in result["rows"]:
        plain = f"{r['plain_read_tokens_per_s'] / 1e6:,.0f}"
        if r["form"] == "encrypted":
            plain += f" / {r['plain_read_unseal_tokens_per_s'] / 1e6:,.0f}"
        slow += [
            f"{LOADER_STORES[r['store']]} {r['form']} at {shape.replace('x', '×')}"
            for shape in ("32x1024", "16x64")
            if r[f"ratio_{shape}"] < 0.8
        ]
        wait = waits[f"{r['store']} {r['form']}"]["data_wait_fraction"]
        lines.append(
            row(
                LOADER_STORES[r["store"]],
                r["form"],
                plain,
                f"{r['loader_tokens_per_s_32x1024'] / 1e6:,.0f}",
                both(r, "32x1024"),
                f"{r['loader_tokens_per_s_16x64'] / 1e6:,.0f}",
                both(r, "16x64"),
                f"{100 * wait:.2f}%",
            )
        )
    worst_wait = max(w["data_wait_fraction"] for w in waits.values())
    if worst_wait >= 0.02:
        misses.append(f"data wait < 2%: {100 * worst_wait:.2f}%")
    tiny, gpu = result["gpt_tiny"], result["gpu_model"]
    loads = result["load_average_1m"]["throughput_trials"]
    dataset = result["dataset"]
    return [
        f"Million tokens/s from {dataset['tokens'] * 2 / 2**20:.0f} MiB of {dataset['dtype']} shards of "
        f"{dataset['shard_tokens'] * 2 / 2**20:.0f} MiB, median of {result['method']['trials']} interleaved trials "
        f"after a warm-up (load average {min(loads):.1f}–{max(loads):.1f}). For encrypted shards the baseline is "
        "the plain read of the ciphertext / that read followed by `unseal`, and the ratio is against each. The "
        f"data wait is that of gpt-tiny runs of {waits['local raw']['steps']} steps ({tiny['steps_per_s']:.0f} "
        "steps/s) fed by the loader:",
        "",
        *lines,
        "",
        f"The slowest loader row gives {tiny['headroom']:,.0f}× the tokens/s gpt-tiny needs and "
        f"{gpu['headroom']:,.0f}× what {gpu['name']} needs; the longest data wait is {100 * worst_wait:.2f}% of "
        "the run.",
        missed(([f"≥ 0.8× the plain read for {', '.join(slow)}"] if slow else []) + misses),
        reproduce(
            "bench_dataloader.py",
            " (about 5 min; it starts its own moto server and Azurite)",
            quick=result.get("quick", False),
        ),
    ]


@table("cli")
def cli(load: Callable[[str], dict]) -> list[str]:
    result = load("cli")
    base = result["baseline"]["median_s"]
    lines = header("command", "talks to the server", "median start-to-exit", "× `python -c pass`")
    for r in result["commands"]:
        lines.append(
            row(
                f"`{r['command']}`",
                "yes" if r["talks_to_server"] else "no",
                f"{r['median_s']:.2f} s",
                f"{r['ratio']:.1f}×",
            )
        )
    slow = [f"`{r['command']}` ≤ {result['target_s']} s" for r in result["commands"] if not r["meets_target"]]
    return [
        f"Wall time of fresh `cantata` processes next to `python -c pass` ({base:.2f} s here), median of "
        f"{result['trials']} interleaved trials (load average {result['machine']['load_average_1m']}); the server "
        "is a real one on loopback over mutual TLS:",
        "",
        *lines,
        "",
        missed(slow),
        reproduce("bench_cli.py", " (about 1 min on a quiet machine; it starts its own server)", quick=result["quick"]),
    ]


@table("worker_start")
def worker_start(load: Callable[[str], dict]) -> list[str]:
    result = load("worker_start")
    median = result["median_s"]
    return [
        "Submit to the first training step of a 2-worker job, tenant's view, two servers side by side"
        f" ({result['trials']} interleaved trials each, median; load average {result['machine']['load_average_1m']}"
        " on the 2 cores at the end of the run):",
        "",
        *header("workers start", "seconds", "ratio"),
        row(
            "cold: each worker imports torch, the training modules and reads the corpus",
            f"{median['cold']:.2f}",
            "1.00×",
        ),
        row(
            "warm: forked from the zygote that already did",
            f"{median['warm']:.2f}",
            f"{result['cold_over_warm']:.2f}× faster",
        ),
        "",
        reproduce("bench_worker_start.py", quick=result["quick"]),
    ]


@table("executor")
def executor(load: Callable[[str], dict]) -> list[str]:
    result = load("executor")
    first, drain, per_job = result["first_step_median_s"], result["drain_s"], result["drain_per_job_s"]
    trials = result["first_step_s"]
    return [
        "The local executor vs the Ray executor (a one-node Ray cluster with token authentication and TLS, in a"
        f" network namespace), two servers side by side on the same machine, {result['slots']} worker slots each"
        f" (load average {result['machine']['load_average_1m']} on the 2 cores at the end of the run):",
        "",
        *header("", "local", "Ray", "Ray / local"),
        row(
            f"submit to first step, 2-worker job (median of {result['trials']})",
            f"{first['local']:.2f} s",
            f"{first['ray']:.2f} s",
            f"{result['first_step_ray_over_local']:.2f}×",
        ),
        row(
            f"drain {result['jobs']} queued one-step jobs",
            f"{drain['local']:.1f} s ({per_job['local']:.2f} s a job)",
            f"{drain['ray']:.1f} s ({per_job['ray']:.2f} s a job)",
            f"{result['drain_ray_over_local']:.2f}×",
        ),
        "",
        f"Ray's overhead: {result['ray_first_step_overhead_s']:.2f} s to the first step, and"
        f" {result['ray_overhead_per_job_s']:.2f} s a job while draining (target: under 2 s; a placement group that"
        " only reserves, and a few calls to each node's host actor, whose warm zygote forks the workers)."
        f" First-step trials: local {min(trials['local']):.2f}–{max(trials['local']):.2f} s, Ray"
        f" {min(trials['ray']):.2f}–{max(trials['ray']):.2f} s."
        + (
            " Ray drained faster: its workers run one thread each (their bundle's CPU), the local"
            f" executor's the machine's cores over the job's processes ({result['machine']['cpus']} here,"
            f" {result['slots']} jobs at once); the two drains ran one after the other."
            if result["ray_overhead_per_job_s"] < 0
            else ""
        ),
        "",
        reproduce("bench_executor.py", " (as root: it builds a network namespace)", quick=result["quick"]),
    ]


def render(name: str, results: Path = RESULTS, tables: dict[str, Table] = TABLES) -> str:
    """The body of one region of the page, from the results JSON."""

    def load(benchmark: str) -> dict:
        return json.loads((results / f"bench_{benchmark}.json").read_text())

    return "\n".join(tables[name](load)) + "\n"


def rewrite(text: str, results: Path = RESULTS, tables: dict[str, Table] = TABLES) -> str:
    """``text`` with every marked region regenerated; every one of ``tables`` must have exactly one region."""
    found = [m.group("name") for m in REGION.finditer(text)]
    unknown = sorted(set(found) - tables.keys())
    absent = sorted(tables.keys() - set(found))
    repeated = sorted({n for n in found if found.count(n) > 1})
    if unknown or absent or repeated:
        raise ValueError(f"benchmark regions: unknown {unknown}, missing {absent}, repeated {repeated}")
    return REGION.sub(lambda m: m.group(1) + render(m.group("name"), results, tables) + m.group(4), text)


# A measured number: a decimal or a ratio or share, with its unit (a range counts as one).
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
QUOTED = re.compile(
    rf"(?<![\w.\-/`])(?P<low>{_NUMBER})(?:\s?[–-]\s?(?P<high>{_NUMBER}))?\s?"
    r"(?P<unit>×(?!\s?\d)|x(?!\s?\d)(?!\w)|%|ms\b|µs\b|s\b|GiB\b|MiB\b|GB/s|MB/s|tokens/s)"
)
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.DOTALL | re.MULTILINE)
# Numbers that state a setting, a limit or an example, not a measurement: page -> the quotes as written.
SETTINGS: dict[str, tuple[str, ...]] = {
    "architecture.md": ("4×", "0.25 s"),
    "benchmarks.md": ("0.8×",),  # the data loader's target
    "dashboard.md": ("100 %",),  # one core busy, the CPU figure's unit
    "operations.md": ("0.5 s", "1%", "7.3 GiB", "2.1 GiB", "24.0 GiB", "15%"),
    "security.md": ("0.25 s", "5%"),
    "training.md": ("6.5 GiB", "40%", "1.2x"),  # the big-model test's RLIMIT_AS; issue 35's GPU targets
    "user-guide.md": ("1%", "5%"),
}


def _blank(match: re.Match[str]) -> str:
    """The match as spaces, its line breaks kept (so that line numbers still hold)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def quoted_numbers(page: Path, text: str) -> list[str]:
    """The measured numbers ``text`` quotes outside generated tables and code (each as ``page:line: quote``)."""
    if "<!-- Generated by" in text:  # a page generated from code (docs/job-fields.md)
        return []
    settings = SETTINGS.get(page.name, ())
    prose = CODE.sub(_blank, REGION.sub(_blank, text))
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    found, used = [], set()
    for m in QUOTED.finditer(prose):
        if not ("." in m["low"] or m["unit"] in ("×", "x", "%")):
            continue  # a whole number of seconds or bytes: a setting or a limit
        if m.group(0) in settings:
            used.add(m.group(0))
        else:
            found.append(f"{name}:{prose.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    found += [f"{name}: {quote}: in SETTINGS but no longer quoted" for quote in settings if quote not in used]
    return found


def unsourced(paths: list[Path] | None = None) -> list[str]:
    """Every measured number README.md and docs/*.md quote that no generated table renders from the JSON."""
    return [quote for page in paths or pages() for quote in quoted_numbers(page, page.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a page is not what the JSON gives")
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    stale = []
    for page, tables in ((args.page, TABLES), (args.readme, README_TABLES)):
        text = page.read_text()
        fresh = rewrite(text, args.results, tables)
        if fresh == text:
            continue
        if args.check:
            print(f"{page} is stale: run {RUN}tables.py", file=sys.stderr)
            stale.append(page)
        else:
            page.write_text(fresh)
            print(f"rewrote {page}")
    if args.check:
        quotes = unsourced()
        for quote in quotes:
            print(f"{quote}: a measured number outside a generated table (generate it, or drop it)", file=sys.stderr)
        return 1 if quotes or stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
