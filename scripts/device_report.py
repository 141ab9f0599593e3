"""The bookkeeping half of scripts/device_check.sh: records each step's outcome and writes one Markdown report.

  python scripts/device_report.py record OUTDIR NAME RC START END LIMIT -- COMMAND...   # one line in steps.jsonl
  python scripts/device_report.py skip OUTDIR NAME REASON
  python scripts/device_report.py write OUTDIR      # OUTDIR/device_check.md; exit 1 if any step failed

The commands are positional (absl flags parse the line, so ``--help`` works; ``--`` keeps COMMAND's own flags
from being read as this script's).

Kept apart from the shell script so the report is testable on synthetic step results, and free of JAX imports so
recording a step costs nothing beside the step itself. Each step's key numbers are read from the files the step
wrote under OUTDIR (the names below are device_check.sh's); a missing or unreadable file shows as "–", never as a
crash, since a failed step is exactly when the report matters.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import sys
import xml.etree.ElementTree as ET
from typing import Any, Callable

from absl import app

from attn_lab.cli import parse_flags
from attn_lab.markdown import markdown_table
from attn_lab.results import RESULTS_FILE, speed, test_metric

TIMEOUT_CODES = (124, 137)  # timeout(1): limit reached, or killed after the grace period


# --- recording ------------------------------------------------------------------------------------------------------

def step_status(rc: int | None, skipped: str | None = None) -> str:
    """'ok', 'failed', 'timed out' or 'skipped' -- the only four, so counting failures is a string compare."""
    if skipped is not None:
        return "skipped"
    return "ok" if rc == 0 else "timed out" if rc in TIMEOUT_CODES else "failed"


def record(out: str, step: dict[str, Any]) -> None:
    """Appends one step (name, status, rc, seconds, command, log, ...) to OUTDIR/steps.jsonl."""
    with open(os.path.join(out, "steps.jsonl"), "a") as f:
        f.write(json.dumps(step) + "\n")


def read_steps(out: str) -> list[dict[str, Any]]:
    """Steps in the order they first ran; a step recorded twice (a partial rerun into the same OUTDIR) keeps its
    last record, in its first place."""
    steps: dict[str, dict[str, Any]] = {}
    try:
        with open(os.path.join(out, "steps.jsonl")) as f:
            for line in f:
                if line.strip():
                    step = json.loads(line)
                    steps[step["name"]] = step
    except FileNotFoundError:
        pass
    return list(steps.values())


# --- reading what the steps wrote -----------------------------------------------------------------------------------

def read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def num(x: Any, spec: str = ".3g", scale: float = 1.0, unit: str = "") -> str:
    """A number formatted, or '–' for anything that is not one (a missing key in a failed step's output)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "–"
    return f"{x * scale if scale != 1.0 else x:{spec}}{unit}"


def flops(x: Any) -> str:
    """FLOP/s in the unit that reads well on both a CPU (GFLOP/s) and a GPU (TFLOP/s)."""
    if not isinstance(x, (int, float)):
        return "–"
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.1f} GFLOP/s"


def tests_summary(out: str, step: dict) -> tuple[str, list[str]]:
    """Counts from pytest's JUnit XML (OUTDIR/tests.xml); the log's last summary line when there is none."""
    try:
        root = ET.parse(os.path.join(out, "tests.xml")).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        if n["tests"] == 0:
            raise ValueError("no test ran (--collect-only): the log says what was collected")
        passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
        failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                  if c.find("failure") is not None or c.find("error") is not None]
        key = f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped"
        return key, [f"- failed: `{name}`" for name in failed[:30]] + (
            [f"- ... and {len(failed) - 30} more"] if len(failed) > 30 else [])
    except (OSError, ET.ParseError, AttributeError, ValueError):
        pass
    log = tail(step.get("log"), 400)
    per_file = [int(m.group(1)) for ln in log for m in [re.match(r"^tests/\S+\.py: (\d+)$", ln)] if m]
    if per_file:  # pytest -qq --collect-only: one "file: count" line per file
        return f"{sum(per_file)} tests collected in {len(per_file)} files (not run)", []
    lines = [ln for ln in log if re.search(r"\d+ (passed|failed|errors?|tests? collected)", ln)]
    return (lines[-1].strip("= ") if lines else "–"), []


def attention_summary(out: str, step: dict) -> tuple[str, list[str]]:
    """The benchmark's own Time, Memory and Targets sections, embedded; the key numbers are its target counts."""
    try:
        with open(os.path.join(out, "bench_attention.md")) as f:
            text = f.read()
    except OSError:
        return "–", []
    sections = re.split(r"^## ", text, flags=re.M)
    keep = [s for s in sections[1:] if s.startswith(("Time", "Memory", "Targets"))]
    intro = sections[0].split("\n", 2)[-1].strip()
    targets = re.findall(r"^- (PASS|FAIL|SKIP) (.*)$", text, flags=re.M)
    cudnn = [f"{verdict} {what.split(':')[0]}" for verdict, what in targets if "cuDNN" in what]
    counts = {v: sum(1 for t, _ in targets if t == v) for v in ("PASS", "FAIL", "SKIP")}
    if cudnn and all(c.startswith("SKIP") for c in cudnn):
        key = "cuDNN targets not measured (no cuDNN)"
    else:
        key = "; ".join(cudnn) if cudnn else "–"
    key += f" (all targets: {counts['PASS']} pass, {counts['FAIL']} fail, {counts['SKIP']} skip)"
    return key, [intro, ""] + [f"#### {s.strip()}\n" for s in keep]


def train_summary(out: str, step: dict) -> tuple[str, list[str]]:
    """bench_train's params, step time, tokens/s, MFU (and the 209M model's MFU target on an accelerator)."""
    r = read_json(os.path.join(out, f"bench_{step['name']}.json"))
    if not isinstance(r, dict):
        return "–", []
    a = r.get("args", {})
    key = (f"{num(r.get('params'), ',')} params, {a.get('dtype', '?')}, {num(r.get('seconds_per_step'), '.3g', 1e3)} "
           f"ms/step, {num(r.get('tokens_per_sec'), ',.0f')} tokens/s, MFU {num(r.get('mfu'), '.1f', 100)}%, "
           f"HFU {num(r.get('hfu'), '.1f', 100)}%")
    lines = [f"- device {r.get('device', '?')}; d_model {a.get('d_model')}, {a.get('layers')}+{a.get('layers')} "
             f"layers, batch {a.get('batch')} x {a.get('length')}; matmul peak {flops(r.get('peak_flops_per_sec'))}"]
    if step["name"] == "train_large" and not str(r.get("device", "cpu")).startswith("cpu"):
        ok = isinstance(r.get("mfu"), (int, float)) and r["mfu"] >= 0.5
        lines.append(f"- {'PASS' if ok else 'FAIL'} {num(r.get('params'), '.3g', 1e-6)}M-parameter model "
                     f"{a.get('dtype')} MFU >= 50%: {num(r.get('mfu'), '.1f', 100)}%")
    return key, lines


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists -> {'a.b': leaf}, so a report can pick keys from an output whose layout it does not
    fix; a list item with a 'length' is named by it ('decode[256].cached_speedup'), others by position."""
    if isinstance(d, list):
        named = [(f"{prefix}[{v['length']}]" if isinstance(v, dict) and "length" in v else f"{prefix}[{i}]", v)
                 for i, v in enumerate(d)]
    elif isinstance(d, dict):
        named = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in d.items()]
    else:
        return {prefix: d}
    items: dict[str, Any] = {}
    for key, v in named:
        items.update(flat(v, key))
    return items


def loop_summary(out: str, step: dict) -> tuple[str, list[str]]:
    """bench_train --loop: trainer_over_bare (goal >= 0.9), every ratio-like number it wrote, and cached decoding's
    speed-up at length 256 (goal >= 5x) when it measured that length."""
    paths = sorted(glob.glob(os.path.join(out, "bench_loop*.json")))
    r = flat(read_json(paths[0])) if paths else {}
    if not r:
        return "–", []
    ratio = next((v for k, v in r.items() if k.split(".")[-1] == "trainer_over_bare"), None)
    picked = {k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
              and re.search(r"over|speedup|ratio|steps_per_sec", k)}
    lines = [f"- `{k}`: {num(v, '.4g')}" for k, v in list(picked.items())[:16]]
    if isinstance(ratio, (int, float)):
        lines.append(f"- {'PASS' if ratio >= 0.9 else 'FAIL'} trainer_over_bare >= 0.9: {ratio:.3f}")
    decode = {k: v for k, v in picked.items() if k.endswith("_speedup")}
    at_256 = next((v for k, v in decode.items() if "[256]" in k), None)
    if at_256 is not None:
        lines.append(f"- {'PASS' if at_256 >= 5 else 'FAIL'} KV-cache decoding >= 5x faster at 256: {at_256:.1f}x")
    lengths = [re.sub(r"^.*\[(\d+)\].*$", r"length \1", k) for k in decode]
    speedups = ", ".join(f"{at}: {v:.1f}x" for at, v in zip(lengths, decode.values()))
    return f"trainer_over_bare {num(ratio, '.3f')}" + (f"; decoding speed-up {speedups}" if speedups else ""), lines


def numbers_summary(out: str, step: dict) -> tuple[str, list[str]]:
    """Train speed of the numbers quick run: steady steps/s (after the first log window), compile seconds, wall
    time, test exact match; for vmapped seeds also seed-steps/s and its ratio to the one-seed run."""
    runs = [read_json(p) for p in sorted(glob.glob(os.path.join(out, step["name"], "**", RESULTS_FILE),
                                                   recursive=True))]
    runs = [r for r in runs if isinstance(r, dict)]
    if not runs:
        return "–", []
    speeds = speed(runs[0])
    steady = speeds["steady"]
    rate = steady if isinstance(steady, (int, float)) else speeds["whole"]
    label = "steady steps/s" if isinstance(steady, (int, float)) else "steps/s (incl. compilation)"
    seeds = len(runs)
    key = (f"{seeds} seed{'s' if seeds > 1 else ''}, {speeds['steps']} steps, {label} {num(rate, '.3g')}"
           + (f", seed-steps/s {num(rate * seeds if isinstance(rate, (int, float)) else None, '.3g')}"
              if seeds > 1 else "")
           + f", compile {num(speeds['compile_seconds'], '.1f')} s, wall {num(speeds['wall_time_sec'], '.1f')} s")
    match = [test_metric(x, "exact_match") for x in runs]
    lines = [f"- test exact match per seed: {', '.join(num(m, '.3f') for m in match)}",
             f"- steps/s over the whole run (incl. compilation): {num(speeds['whole'], '.3g')}"]
    one = next((read_json(p) for p in glob.glob(os.path.join(out, "numbers_1seed", RESULTS_FILE))), None)
    if seeds > 1 and isinstance(one, dict) and isinstance(rate, (int, float)):
        base = speed(one)["steady"] if speed(one)["steady"] is not None else speed(one)["whole"]
        if isinstance(base, (int, float)) and base > 0:
            lines.append(f"- seed-steps/s vs one seed: {rate * seeds / base:.2f}x ({seeds} x {rate:.3g} / {base:.3g})")
    return key, lines


def fused_summary(out: str, step: dict) -> tuple[str, list[str]]:
    """scripts/fused_check.py's report: compile failures among the cases the tile rule allows, the largest errors
    against naive attention, and the 16K speed-ups over cuDNN; a table of every case."""
    report = read_json(os.path.join(out, "fused.json"))
    if not isinstance(report, dict):
        return "–", []
    cases, t = report.get("matrix", []), report.get("timings", {})
    allowed = [c for c in cases if not str(c.get("rule", "")).startswith("refused")]
    broken = [c for c in allowed if "error" in c]
    worst = max((max(c["errors"].values()) for c in allowed if "errors" in c), default=None)
    speed = ", ".join(f"{k.split('_')[0]} {t[k]}x" for k in ("local_fused_speedup", "bigbird_fused_speedup") if k in t)
    key = (f"{len(allowed) - len(broken)}/{len(allowed)} allowed cases compile ({len(cases) - len(allowed)} refused "
           f"by the tile rule); largest error {num(worst)}" + (f"; vs cuDNN at {t.get('length')}: {speed}"
                                                               if speed else ""))
    rows = ["| tile | head dim | dtype | stages | rule | compile s | max error | error |", "|---" * 8 + "|"]
    rows += [f"| {c['tile']} | {c['head_dim']} | {c['dtype']} | {c['stages']} | {c.get('rule', '')} | "
             f"{c.get('compile_s', '–')} | {num(max(c['errors'].values())) if 'errors' in c else '–'} | "
             f"{c.get('error', '')} |" for c in cases]
    return key, rows + ["", "Timings: " + json.dumps(t)]


def environment_summary(out: str, step: dict) -> tuple[str, list[str]]:
    return environment_line(out), []


SUMMARIES: dict[str, Callable[[str, dict], tuple[str, list[str]]]] = {
    "environment": environment_summary, "tests": tests_summary, "attention": attention_summary,
    "train_default": train_summary, "train_large": train_summary, "loop": loop_summary,
    "numbers_1seed": numbers_summary, "numbers_8seeds": numbers_summary, "fused": fused_summary}


def summarize(out: str, step: dict) -> tuple[str, list[str]]:
    """A step's key numbers and detail lines; a parser bug must not cost the report, so it becomes a note."""
    fn = SUMMARIES.get(step["name"])
    if fn is None or step["status"] == "skipped":
        return "–", []
    try:
        return fn(out, step)
    except Exception as err:  # noqa: BLE001 -- the report is written whatever a step left behind
        return "–", [f"- (could not read this step's output: {type(err).__name__}: {err})"]


# --- the report -----------------------------------------------------------------------------------------------------

def tail(path: str | None, n: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            lines = f.read().replace("\r", "\n").splitlines()
    except (OSError, TypeError):
        return []
    return [ln for ln in lines if ln.strip()][-n:]


def environment_line(out: str) -> str:
    env = read_json(os.path.join(out, "environment.json"))
    if not isinstance(env, dict):
        return "environment: – (the environment step wrote nothing)"
    pkgs = env.get("packages", {})
    git = env.get("git") or {}
    return (f"{env.get('backend')} {env.get('device_kind')} x{env.get('device_count')}; python {env.get('python')}, "
            f"jax {pkgs.get('jax')}, jaxlib {pkgs.get('jaxlib')}, flax {pkgs.get('flax')}; commit "
            f"{(git.get('commit') or 'no git')[:10]}{' (dirty)' if git.get('dirty') else ''}")


def status_cell(step: dict) -> str:
    if step["status"] == "skipped":
        return f"skipped ({step.get('reason', '')})"
    if step["status"] == "timed out":
        return f"**timed out** (limit {step.get('limit', '?')} s)"
    return "ok" if step["status"] == "ok" else f"**failed** (rc {step.get('rc')})"


def failed(steps: list[dict]) -> list[dict]:
    return [s for s in steps if s["status"] in ("failed", "timed out")]


def render(out: str, steps: list[dict], size: str = "") -> str:
    """The whole report: one summary table (status, seconds, key numbers per step), then each step's details --
    its command, the numbers behind the summary, and the log tail of a step that failed."""
    total = sum(s.get("seconds", 0.0) for s in steps)
    bad = failed(steps)
    lines = ["# Device check", "",
             f"`bash scripts/device_check.sh` -- {environment_line(out)}; sizes: {size or '?'}; "
             f"{len(steps)} steps in {total:.0f} s; "
             + (f"**{len(bad)} failed**: {', '.join(s['name'] for s in bad)}." if bad else "all steps ran."), ""]
    rows, details = [], []
    for s in steps:
        key, more = summarize(out, s)
        if s["name"] == "tests" and s["status"] != "skipped" and not re.search(r"not run|^–$", key):
            more = [f"- {'PASS' if s['status'] == 'ok' else 'FAIL'} the GPU-relevant tests pass: {key}"] + more
        rows.append([s["name"], status_cell(s), f"{s.get('seconds', 0.0):.1f}", key])
        details += [f"### {s['name']}", ""]
        if s.get("command"):
            details += [f"`{shlex.join(s['command'])}`", ""]
        details += more + ([""] if more else [])
        if s["status"] in ("failed", "timed out"):
            details += ["Log tail:", "", "```", *tail(s.get("log"), 25), "```", ""]
    goals = [ln for ln in "\n".join(details).splitlines()
             if re.match(r"^- (PASS|FAIL) ", ln) or re.match(r"^- SKIP .*not measured \(no cuDNN", ln)]
    goals = goals or ["- none measured by the steps that ran"]
    lines.append(markdown_table(["step", "status", "seconds", "key numbers"], rows))
    return "\n".join(lines + ["", "## Targets", ""] + goals + ["", "## Steps", ""] + details) + "\n"


def write(out: str) -> int:
    """Writes OUTDIR/device_check.md; 1 when any step failed or timed out (the script's exit code), else 0."""
    steps = read_steps(out)
    size = (read_json(os.path.join(out, "plan.json")) or {}).get("size", "")
    with open(os.path.join(out, "device_check.md"), "w") as f:
        f.write(render(out, steps, size))
    return 1 if failed(steps) else 0


USAGE = {"record": "record OUTDIR NAME RC START END LIMIT -- COMMAND...", "skip": "skip OUTDIR NAME REASON",
         "write": "write OUTDIR"}


def main(argv: list[str]) -> int:
    """``argv``: the program, then one of :data:`USAGE`'s commands (absl has removed the ``--``)."""
    cmd, *args = argv[1:] or [""]
    if cmd not in USAGE:
        sys.exit(f"error: unknown command {cmd!r}; use record, skip or write")
    if len(args) < len(USAGE[cmd].split(" --")[0].split()) - 1:  # the words between the command and '--'
        sys.exit(f"error: {cmd} takes {USAGE[cmd]}, got {args}")
    out = args[0]
    if cmd == "write":
        return write(out)
    if cmd == "skip":
        record(out, {"name": args[1], "status": "skipped", "reason": args[2], "seconds": 0.0})
        return 0
    name, rc, start, end, limit, *command = args[1:]
    record(out, {"name": name, "status": step_status(int(rc)), "rc": int(rc),
                 "seconds": round(float(end) - float(start), 2), "limit": int(limit),
                 "command": command, "log": os.path.join(out, "logs", f"{name}.log")})
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
