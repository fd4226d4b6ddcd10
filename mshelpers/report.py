"""The evaluation report: runs over seeds, compared with a baseline at the same step count.

Example:
    >>> from mshelpers.report import aggregate, compare
    >>> runs = {"baseline": [{"tokens_per_s": 100.0}, {"tokens_per_s": 104.0}],
    ...         "graph":    [{"tokens_per_s": 610.0}, {"tokens_per_s": 590.0}]}
    >>> row = compare(aggregate(runs), "baseline", ["tokens_per_s"])[1]
    >>> row["tokens_per_s"], row["tokens_per_s vs base"], row["tokens_per_s beyond noise"]
    ('600 ± 10', 5.882, True)

A change counts as real only when it is larger than the seed-to-seed spread: the
difference of the means must exceed the larger of the two runs' ranges (max - min over
seeds). With two seeds that is a coarse but honest control group.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import numbers
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence



class ClaimFailed(AssertionError):
    """A result sentence whose numbers say it is false. Raised by `claim`; it names the numbers.
    Taught with the rest of report.py in notebooks/00_environment.ipynb."""


def _fmt_number(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    v = float(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:.4g}" if abs(v) >= 1e-3 else f"{v:.3e}"


def claim(sentence: str, holds: Any, **numbers_: Any) -> str:
    """Print a result sentence with the numbers it rests on; raise ClaimFailed when `holds` is false.

    A notebook states results only through this: when a rerun changes the numbers so that the
    sentence is no longer true, the cell fails (and nbval with it) instead of printing it.
    `sentence` may use `{name}` fields filled from the numbers (formatted to 4 significant digits).
    A NaN anywhere among the numbers is never a success, whatever `holds` says.

        >>> from mshelpers.report import claim
        >>> claim("graph mode is {ratio}x faster than PyNative", 3.2 >= 2, ratio=3.2, floor=2)
        ✓ graph mode is 3.2x faster than PyNative  [floor=2]
        'graph mode is 3.2x faster than PyNative'
        >>> claim("the loss fell", float("nan") < 6.9, first=6.9, last=float("nan"))
        Traceback (most recent call last):
        ...
        mshelpers.report.ClaimFailed: FALSE: the loss fell  [first=6.9, last=nan]

    Taught in notebooks/00_environment.ipynb.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError(f"claim: sentence={sentence!r} is invalid; fix: pass the result sentence as a str")
    shown = {k: _fmt_number(v) for k, v in numbers_.items()}
    try:
        text = sentence.format(**shown)
    except (KeyError, IndexError) as e:
        raise ValueError(f"claim: sentence names {e} which is not among the numbers; "
                         f"fix: pass it as a keyword, e.g. claim(..., {str(e).strip(chr(39))}=value)") from None
    import string
    used = {f for _, f, _, _ in string.Formatter().parse(sentence) if f}
    nums = ", ".join(f"{k}={v}" for k, v in shown.items() if k not in used)   # the rest, for the record
    tail = f"  [{nums}]" if nums else ""
    has_nan = any(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isnan(float(v))
                  for v in numbers_.values())
    try:
        ok = bool(holds)
    except (ValueError, TypeError) as e:       # e.g. a numpy array: say which, do not guess
        raise ValueError(f"claim: holds={holds!r} is not a truth value ({e}); fix: pass a bool, e.g. .all()") from None
    if not ok or has_nan:
        raise ClaimFailed(f"FALSE: {text}{tail}")
    print(f"✓ {text}{tail}")
    return text


def claim_within(sentence: str, check: dict, **numbers_: Any) -> str:
    """A within-a-factor result (collectives.within_factor's dict: verdict, ratio, band, ...) printed as a claim, or,
    when the miss lies inside the run's own noise band, as one loud 'TOO NOISY' line that claims and fails nothing.
    Returns the verdict: 'within', 'outside' (raises ClaimFailed) or 'too noisy'.

        >>> claim_within("the line predicts it within 2x", {"verdict": "within", "ratio": 1.1, "band": 1.3})
        ✓ the line predicts it within 2x  [ratio=1.1, band=1.3]
        'within'
        >>> claim_within("the line predicts it within 2x", {"verdict": "too noisy", "ratio": 0.3, "band": 9.0})
        TOO NOISY to decide: the line predicts it within 2x  [ratio=0.3, band=9]: the miss lies inside this run's noise band (x9 either way); no claim, no failure: re-run on an idle machine to decide
        'too noisy'

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    verdict = check.get("verdict") if isinstance(check, dict) else None
    if verdict not in ("within", "outside", "too noisy"):
        raise ValueError(f"claim_within: check={check!r} has no verdict 'within', 'outside' or 'too noisy'; fix: pass "
                         "the dict collectives.within_factor returns")
    nums = {"ratio": check.get("ratio"), "band": check.get("band"), **numbers_}
    if verdict == "too noisy":
        shown = {k: _fmt_number(v) for k, v in nums.items()}
        try:
            text = sentence.format(**shown)
        except (KeyError, IndexError) as e:              # the same one line as claim's
            raise ValueError(f"claim_within: sentence names {e} which is not among the numbers; "
                             f"fix: pass it as a keyword, e.g. claim_within(..., {str(e).strip(chr(39))}=value)") from None
        print(f"TOO NOISY to decide: {text}  [" + ", ".join(f"{k}={v}" for k, v in shown.items())
              + f"]: the miss lies inside this run's noise band (x{shown['band']} either way); no claim, no failure: "
              "re-run on an idle machine to decide")
        return verdict
    claim(sentence, verdict == "within", **nums)
    return verdict


def claim_trained(name: str, losses: Sequence[float], floor: float | None = None) -> str:
    """Claim that a run trained: every loss finite, and the last below the first (and above `floor`,
    the entropy floor of the data, when given: a loss under the floor means a bug, not learning).
    Taught in notebooks/01_pynative_baseline.ipynb."""
    vals = [float(x) for x in losses]
    if len(vals) < 2:
        raise ValueError(f"claim_trained: {name} has {len(vals)} losses; fix: pass at least two steps' losses")
    finite = all(math.isfinite(v) for v in vals)
    holds = finite and vals[-1] < vals[0] and (floor is None or vals[-1] >= floor - 1e-6)
    extra = {} if floor is None else {"floor": floor}
    return claim(f"{name} trained: finite losses, from {{first}} to {{last}} in {{steps}} steps", holds,
                 first=vals[0], last=vals[-1], steps=len(vals),
                 nonfinite=sum(not math.isfinite(v) for v in vals), **extra)


TIMING_SENTENCES = {"win": "{cand} is faster than {base}", "within noise": "{cand} and {base} are within the noise",
                    "regression": "{cand} is slower than {base}"}
EXPECTATIONS = (*TIMING_SENTENCES, "undecided")
TIGHT_BAND = 0.15   # as timing.TIGHT_BAND: "within noise" says any change is under ±15 % (effect and band together)


def _load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg()[:2]) + f" on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def _record_timing(entry: dict) -> None:
    """Append one timing verdict to $MSHELPERS_VERDICT_LOG (JSON lines), when set: `make outputs` sets it, and the
    run's manifest then lists every timing claim with its band. A log that cannot be written costs a warning, not
    the verdict."""
    path = os.environ.get("MSHELPERS_VERDICT_LOG")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError as e:
        print(f"claim_timing: could not record the verdict in MSHELPERS_VERDICT_LOG={path!r} ({e}); "
              "fix: point it at a writable file", file=sys.stderr)


def claim_timing(base_name: str, base: Sequence[float], cand_name: str, cand: Sequence[float], *,
                 expect: str | None = None, lower_is_better: bool = True, unit: str = "ms",
                 rel_floor: float = 0.02, control: Sequence[float] | None = None, why_wide: str = "") -> str:
    """A timing verdict against the one expected beforehand. Returns the measured verdict: 'win', 'regression',
    'within noise' or 'too noisy'.

    `expect` is required and states what the cookbook expects before measuring, with its reason in the notebook
    (graph mode against PyNative: 'win'; a no-op such as jit O1 on CPU: 'within noise'). A decided verdict ('win',
    'regression', or 'within noise' when the effect and its band together stay under ±15 %, so that any real
    change is smaller than that) is printed as a sentence by `claim`, and raises ClaimFailed when it contradicts
    `expect`. An effect that does not clear its band, where effect and band reach ±15 % (a -10 % effect inside a
    ±12 % band could be a 22 % regression or none), is 'too noisy': this machine could not tell. That is printed loudly in one line with the band and the load
    average, and is no failure: it contradicts nothing. Where the cookbook cannot know in advance,
    expect='undecided': the measured verdict is printed, nothing is claimed and nothing can fail.

    Without `control`, the rule is timing.verdict's (inlined so this module copies alone): the difference of the
    medians must exceed the larger round-to-round range and `rel_floor` of the baseline. With `control`, an A/A
    copy of the baseline run in the same rounds (aligned by round, as `timing.compare_interleaved(aa_control=True)`
    gives them), it is timing.decide's: the median per-round log-ratio against a band of 2.5 standard errors of
    that median, one round's noise taken robustly from the A/A ratios (1.4826 x their median |log-ratio|) or from
    the candidate's own scatter where wider, with every round but one in six on the same side. An effect that clears the band is decided even when the A/A copies
    differ a little. Every verdict, with its band, is appended to $MSHELPERS_VERDICT_LOG when that is set.
    `why_wide` says, for the run's manifest, why this comparison's band may not get under ±15 % (e.g. a first step
    that includes a compile).

        >>> claim_timing("O0", [100, 110, 105], "O1", [80, 88, 84], expect="win", control=[102, 108, 104])
        ✓ O1 is faster than O0: median 84 ms (80–88) against 105 ms (100–110), ratio 0.8; per round 0.8 (0.8–0.8) against an A/A band of ±5.0 %  [verdict=win, expected=win]
        'win'

        >>> claim_timing("O0", [100, 104, 102], "O1", [80, 82, 81], expect="win")
        ✓ O1 is faster than O0: median 81 ms (80–82) against 102 ms (100–104), ratio 0.794  [verdict=win, expected=win]
        'win'
        >>> claim_timing("O0", [100, 104, 102], "O1", [80, 82, 81], expect="undecided")
        undecided beforehand, measured: O1 is faster than O0: median 81 ms (80–82) against 102 ms (100–104), ratio 0.794  [verdict=win; not a claim]
        'win'
        >>> claim_timing("base", [10] * 4, "recompute", [9.0, 9.2, 8.8, 9.1], expect="regression",
        ...              lower_is_better=False, unit="tokens/s", control=[9.5, 10.5, 10.5, 9.5])
        TOO NOISY to decide recompute against base: ... against an A/A band of ±12.3 %; a band of ±12.3 % ...
        'too noisy'

    Taught in notebooks/02_graph_mode.ipynb.
    """
    if expect not in EXPECTATIONS:
        raise ValueError(f"claim_timing: expect={expect!r} is invalid; fix: state the verdict expected beforehand, "
                         f"one of {list(EXPECTATIONS)} ('undecided' when it cannot be known in advance)")
    if len(base) == 0 or len(cand) == 0:     # len, not truth: numpy arrays are welcome
        raise ValueError("claim_timing: base and cand need at least one value each; fix: run more rounds")
    b, c = sorted(float(x) for x in base), sorted(float(x) for x in cand)
    bm, cm = statistics.median(b), statistics.median(c)
    f = lambda v: f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    paired = ""
    if control is None:
        noise = max(b[-1] - b[0], c[-1] - c[0], rel_floor * abs(bm))
        delta = (bm - cm) if lower_is_better else (cm - bm)
        band = noise / abs(bm) if bm else float("inf")
        decided = abs(delta) > noise
        inside = abs(delta) + noise < TIGHT_BAND * abs(bm)   # within noise: any real change is under ±15 %
    else:
        if not (len(control) == len(base) == len(cand)) or len(base) < 2:
            raise ValueError(f"claim_timing: base, cand and control have {len(base)}, {len(cand)} and {len(control)} "
                             "values; fix: one value per round, at least 2 rounds, in the same order")
        if min(map(float, (*base, *cand, *control))) <= 0:
            raise ValueError("claim_timing: with a control every value must be > 0; fix: pass times or rates")
        sign = 1 if lower_is_better else -1            # d > 0: the candidate is better
        d = [sign * math.log(float(x) / float(y)) for x, y in zip(base, cand)]
        a = [math.log(float(z) / float(x)) for x, z in zip(base, control)]
        delta = statistics.median(d)
        sigma = 1.4826 * max(statistics.median(abs(x) for x in a), statistics.median(abs(x - delta) for x in d))
        band_log = max(2.5 * 1.2533 * sigma / math.sqrt(len(d)), math.log(1 + rel_floor))
        band = math.exp(band_log) - 1
        decided = abs(delta) > band_log and sum((x > 0) != (delta > 0) for x in d) <= len(d) // 6
        inside = abs(delta) + band_log < math.log(1 + TIGHT_BAND)
        r = sorted(float(y) / float(x) for x, y in zip(base, cand))
        paired = (f"; per round {statistics.median(r):.3g} ({r[0]:.3g}–{r[-1]:.3g}) against an A/A band of "
                  f"±{100 * band:.1f} %")
    verdict = ("win" if delta > 0 else "regression") if decided else "within noise" if inside else "too noisy"
    _record_timing({"base": base_name, "cand": cand_name, "verdict": verdict, "expected": expect,
                    "band": round(band, 4), "rounds": len(base), "why_wide": why_wide, "load": _load_average()})
    sentence = TIMING_SENTENCES.get(verdict, "{cand} against {base}").format(cand=cand_name, base=base_name)
    text = (sentence + f": median {f(cm)} {unit} ({f(c[0])}–{f(c[-1])}) against {f(bm)} {unit} "
            f"({f(b[0])}–{f(b[-1])}), ratio {cm / bm:.3g}" + paired if bm else sentence)
    if verdict == "too noisy":
        print(f"TOO NOISY to decide {cand_name} against {base_name}: {text.split(': ', 1)[-1]}; a band of "
              f"±{100 * band:.1f} % (a verdict needs the effect to clear it, 'within noise' the effect and the band "
              f"together under ±{100 * TIGHT_BAND:.0f} %), load average {_load_average()}  [expected={expect}; no claim, no failure: "
              "re-run on an idle machine to decide]")
        return verdict
    if expect == "undecided":
        print(f"undecided beforehand, measured: {text}  [verdict={verdict}; not a claim]")
        return verdict
    claim(text.replace("{", "{{").replace("}", "}}"), verdict == expect, verdict=verdict, expected=expect)
    return verdict


# --- one figure per quantity: measured once in a run, quoted after ---
def _read_figures(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        got = json.loads(text)
        if not isinstance(got, dict):
            raise ValueError("not an object")
        return got
    except ValueError as e:
        raise ValueError(f"figures file {str(path)!r} is not a JSON object of figures ({e}); fix: delete it and re-run "
                         "the notebook that records them") from None


def record_figure(path: str | os.PathLike, name: str, value: float, unit: str, where: str, **context: Any) -> dict:
    """Record one measured figure of this run (e.g. the graph-mode mini step, measured in notebook 02) in the JSON
    file `path`, so that later notebooks quote it instead of measuring the same quantity again. `context` says what
    was measured (batch, steps counted...). Two writers at once both land: the file is locked while it is read,
    changed and replaced (a temporary file renamed over it, so a killed writer leaves the old file whole).

        >>> import tempfile, os; p = os.path.join(tempfile.mkdtemp(), "figures.json")
        >>> record_figure(p, "graph step", 183.2, "ms", "02_graph_mode", batch=8)["value"]
        183.2

    Taught in notebooks/02_graph_mode.ipynb.
    """
    import fcntl
    import math as _m
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not _m.isfinite(value):
        raise ValueError(f"record_figure: value={value!r} for {name!r} is invalid; fix: pass the finite number measured")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"value": float(value), "unit": unit, "where": where, **context}
    with open(path.with_suffix(path.suffix + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        figures = _read_figures(path)
        figures[name] = entry
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return entry


def quote_figure(path: str | os.PathLike, name: str, here: float | None = None, why: str = "") -> dict:
    """Print the figure `name` as it was measured once in this run (`record_figure`), and, when this notebook
    measures its own value `here` of the same quantity, that value beside it with `why` it differs (batch, steps
    counted, profiler on). Returns the entry, or None when nobody recorded it yet: notebooks may run in any order
    (nbval runs them two at a time), so that is said in one line with the notebook to run first, not raised.

        >>> import tempfile, os; p = os.path.join(tempfile.mkdtemp(), "figures.json")
        >>> _ = record_figure(p, "graph step", 183.2, "ms", "02_graph_mode", batch=8)
        >>> _ = quote_figure(p, "graph step", here=208.0, why="the profiler records every step")
        graph step: 183.2 ms, measured once in 02_graph_mode (batch=8); here 208 ms (x1.14): the profiler records every step

    Taught in notebooks/02_graph_mode.ipynb.
    """
    if here is not None and not why:
        raise ValueError(f"quote_figure: {name!r} measured here too ({here}) without a reason; fix: pass why= "
                         "(what differs: batch, steps counted, profiler on)")
    figures = _read_figures(Path(path))
    if name not in figures:
        print(f"{name}: not recorded yet in {str(path)!r} (recorded: {sorted(figures)}); the notebook that measures "
              f"it records it when run first (make outputs runs them in order)"
              + (f"; here {_fmt_number(here)}: {why}" if here is not None else ""))
        return None
    e = figures[name]
    ctx = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("value", "unit", "where"))
    line = f"{name}: {_fmt_number(e['value'])} {e['unit']}, measured once in {e['where']}" + (f" ({ctx})" if ctx else "")
    if here is not None:
        line += f"; here {_fmt_number(here)} {e['unit']} (x{here / e['value']:.2f}): {why}"
    print(line)
    return e


def aggregate(runs: dict[str, Sequence[dict]]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """For each run name and numeric metric: (mean, min, max) over the seeds' summaries.
    Taught with the rest of report.py in notebooks/00_environment.ipynb."""
    if not runs:
        raise ValueError("aggregate: runs is empty; fix: pass {name: [summary per seed, ...]}")
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for name, seeds in runs.items():
        if not seeds:
            raise ValueError(f"aggregate: run {name!r} has no seeds; fix: run it at least once (twice for a spread)")
        keys = [k for k, v in seeds[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                or isinstance(v, bool)]
        out[name] = {}
        for k in keys:
            vals = [float(s[k]) for s in seeds if s.get(k) is not None]
            if vals:
                out[name][k] = (statistics.fmean(vals), min(vals), max(vals))
    return out


def _pm(mean: float, lo: float, hi: float) -> str:
    half = (hi - lo) / 2
    fmt = (lambda v: f"{v:,.0f}") if abs(mean) >= 100 else (lambda v: f"{v:.3g}")
    return f"{fmt(mean)} ± {fmt(half)}"


def compare(agg: dict, baseline: str, metrics: Sequence[str]) -> list[dict]:
    """One row per run: each metric as 'mean ± half-range', its ratio to the baseline, and
    whether the difference exceeds the seed-to-seed spread.
    Taught with the rest of report.py in notebooks/00_environment.ipynb."""
    if baseline not in agg:
        raise ValueError(f"compare: baseline={baseline!r} is not a run; fix: use one of {list(agg)}")
    missing = [m for m in metrics if m not in agg[baseline]]
    if missing:
        raise ValueError(f"compare: metric {missing[0]!r} is not in the runs; fix: use one of {list(agg[baseline])}")
    rows = []
    for name, m in agg.items():
        row: dict[str, Any] = {"run": name}
        for k in metrics:
            mean, lo, hi = m[k]
            bmean, blo, bhi = agg[baseline][k]
            row[k] = _pm(mean, lo, hi)
            if name != baseline:
                row[f"{k} vs base"] = round(mean / bmean, 3) if bmean else None   # no ratio to zero
                row[f"{k} beyond noise"] = abs(mean - bmean) > max(hi - lo, bhi - blo)
        rows.append(row)
    return rows


def check_mfu_claim(tokens_per_s: float, flops_per_token: float, n_devices: int, claimed_mfu: float,
                    peak_flops_per_device: float) -> dict[str, float | bool]:
    """Is a published (tokens/s, devices, MFU) triple consistent with a device's peak?

    Returns the per-device peak the claim implies, the MFU the figures give against the
    stated peak, and `consistent` = the two peaks agree within a factor of 1.5.
    Taught in notebooks/09_evaluation_report.ipynb.
    """
    for name, v in (("tokens_per_s", tokens_per_s), ("flops_per_token", flops_per_token),
                    ("claimed_mfu", claimed_mfu), ("peak_flops_per_device", peak_flops_per_device)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0:
            raise ValueError(f"check_mfu_claim: {name}={v!r} is invalid; fix: pass a positive number")
    if not 0 < claimed_mfu <= 1:
        raise ValueError(f"check_mfu_claim: claimed_mfu={claimed_mfu} is invalid; fix: pass a fraction, e.g. 0.14")
    achieved = tokens_per_s * flops_per_token / n_devices
    implied_peak = achieved / claimed_mfu
    ratio = implied_peak / peak_flops_per_device
    return {"achieved_flops_per_device": achieved, "implied_peak_per_device": implied_peak,
            "implied_over_stated_peak": ratio, "mfu_vs_stated_peak": achieved / peak_flops_per_device,
            "consistent": 1 / 1.5 <= ratio <= 1.5}


def figure_png(fig) -> str:
    """A matplotlib figure as base64 PNG, for a self-contained HTML report.
    Taught with the rest of report.py in notebooks/00_environment.ipynb."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _md_table_to_html(md: str) -> str:
    lines = [l for l in md.strip().splitlines() if l.strip()]
    cells = lambda l: [html.escape(c.strip()) for c in l.strip().strip("|").split("|")]
    head, body = cells(lines[0]), [cells(l) for l in lines[2:]]
    return ("<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in body) + "</tbody></table>")


def write_report(out_dir: str | os.PathLike, title: str, sections: Sequence[tuple],
                 *, verdict_lines: Sequence[str] = (), machine: str | None = None) -> dict[str, Path]:
    """Write report.md and a standalone report.html (plots embedded) under out_dir.

    verdict_lines: the plain-words verdict, one line per change with its measured effect and noise;
        the report opens with them, before any detail table.
    machine: one line naming the machine and the MFU peak used (shown under the title).
    sections: (heading, markdown text or markdown table, matplotlib figure or None[, caption]).
    Figures are also saved as PNG next to the Markdown, which links them.
    Taught in notebooks/09_evaluation_report.ipynb.
    """
    if not sections:
        raise ValueError("write_report: sections is empty; fix: pass (heading, text, figure) tuples")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, body = [f"# {title}", ""], []
    if machine:
        md += [f"*{machine}*", ""]
        body.append(f'<p class="machine">{html.escape(machine)}</p>')
    if verdict_lines:
        md += ["## Verdict", ""] + [f"- {l}" for l in verdict_lines] + [""]
        body.append('<div class="verdict"><h2>Verdict</h2><ul>'
                    + "".join(f"<li>{html.escape(l)}</li>" for l in verdict_lines) + "</ul></div>")
    for i, section in enumerate(sections):
        heading, text, fig = section[:3]
        caption = section[3] if len(section) > 3 else heading
        md += [f"## {heading}", "", text.strip(), ""]
        block = _md_table_to_html(text) if text.lstrip().startswith("|") else \
            "".join(f"<p>{html.escape(p)}</p>" for p in text.strip().split("\n\n"))
        body.append(f"<h2>{html.escape(heading)}</h2>{block}")
        if fig is not None:
            png = figure_png(fig)
            name = f"figure_{i}.png"
            (out / name).write_bytes(base64.b64decode(png))
            md += [f"![{caption}]({name})", "", f"*{caption}*", ""]
            body.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{png}">'
                        f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    (out / "report.md").write_text("\n".join(md))
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222;line-height:1.45}"
             "h1{border-bottom:2px solid #444}h2{margin-top:1.6em}.machine{color:#555;font-style:italic}"
             ".verdict{background:#f3f7ff;border-left:4px solid #3367d6;padding:.4em 1em}"
             "table{border-collapse:collapse;margin:.6em 0;font-size:.92em}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#eef1f5}"
             "tbody tr:nth-child(even){background:#fafafa}td:first-child,th:first-child{text-align:left}"
             "figure{margin:1em 0}img{max-width:100%}figcaption{color:#555;font-size:.9em}")
    (out / "report.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
                                     f"</title><style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
                                     + "".join(body) + "</body></html>")
    return {"markdown": out / "report.md", "html": out / "report.html"}


def run_summaries(cfg_yaml: str, seeds: Sequence[int], steps: int, csv_dir: str,
                  peak_flops: float | None = None) -> list[dict]:
    """Train one config once per seed and return the summaries; meant for `timing.run_isolated`.

    All seeds of a config share one fresh process: the import and first compile are paid
    once, and the process peak is the config's (every seed trains the same shapes).
    Pass one `peak_flops` for all configs so that their MFUs share a denominator.
    Taught with the rest of report.py in notebooks/00_environment.ipynb.
    """
    if __package__:
        from .config import RunConfig
        from .train import train
    else:  # copied beside its siblings as plain files
        from config import RunConfig
        from train import train
    cfg = RunConfig.from_yaml(cfg_yaml)
    return [train(cfg.replace(seed=s), steps=steps, csv_path=Path(csv_dir) / f"{cfg.name}-s{s}.csv",
                  progress=False, peak_flops=peak_flops).summary() for s in seeds]


def resume_check(cfg: Any, n: int, where: str | os.PathLike) -> dict[str, Any]:
    """Exact-resume check: 2n steps straight against a rebuilt model resumed from the step-n checkpoint.

    Returns per-step losses, learning rates and loss scales of both, the data positions
    stored in the step-2n checkpoints, and `bitwise`: every one of them identical.
    Give `cfg` a warm-up shorter than n and a dynamic loss scale that overflows at first
    (e.g. loss_scale=2**127 in float32), so the check crosses both a warm-up boundary and
    scale changes before the checkpoint.
    Taught in notebooks/09_evaluation_report.ipynb.
    """
    import shutil
    if __package__:
        from . import checkpoint
        from .train import train
    else:  # copied beside its siblings as plain files
        import checkpoint
        from train import train
    where = Path(where)
    shutil.rmtree(where, ignore_errors=True)
    cfg = cfg.replace(steps=2 * n)
    kw = dict(progress=False, ckpt_every=n)
    straight = train(cfg, steps=2 * n, csv_path=where / "straight.csv", ckpt_dir=where / "ckpt_straight", **kw)
    # The step-n checkpoint the straight run wrote is what a run stopped at step n leaves behind (the
    # run is deterministic), so the resumed run starts from a copy of it: a rebuilt model and optimizer,
    # loaded, then n more steps. One compile fewer than training the first half again.
    (where / "ckpt_resumed").mkdir(parents=True, exist_ok=True)
    shutil.copy2(where / "ckpt_straight" / f"step_{n:06d}.ckpt", where / "ckpt_resumed" / f"step_{n:06d}.ckpt")
    with (where / "straight.csv").open() as f, (where / "resumed.csv").open("w") as g:
        lines = f.read().splitlines(keepends=True)
        g.writelines(lines[:n + 1])            # header + rows 1..n, as the stopped run would have left them
    resumed = train(cfg, steps=2 * n, csv_path=where / "resumed.csv", ckpt_dir=where / "ckpt_resumed",
                    resume=True, **kw)
    out: dict[str, Any] = {"n": n}
    for key in ("loss", "lr", "loss_scale", "overflow"):
        out[f"straight_{key}"], out[f"resumed_{key}"] = straight.column(key), resumed.column(key)
        a, b = out[f"straight_{key}"], out[f"resumed_{key}"]
        # identical floats; an overflowed step's NaN loss counts as equal to a NaN in the same place
        out[f"{key}_equal"] = len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))
    import numpy as np
    pos, state = {}, {}
    for name in ("straight", "resumed"):
        found = checkpoint.latest_good(where / f"ckpt_{name}")
        pos[name] = found[1]["data_pos"] if found and found[1]["step"] == 2 * n else None
        state[name] = ({k: v.asnumpy() for k, v in checkpoint.read(found[0]).items() if hasattr(v, "asnumpy")}
                   if found else {})   # text entries (the run identity) are not state
    out["data_pos_straight"], out["data_pos_resumed"] = pos["straight"], pos["resumed"]
    out["data_pos_equal"] = pos["straight"] is not None and pos["straight"] == pos["resumed"]
    a, b = state["straight"], state["resumed"]
    # the optimizer's own step counter is the learning-rate position; every weight and moment must match too
    steps_key = next((k for k in a if k.endswith("global_step")), None)
    out["lr_position"] = (int(a[steps_key].reshape(-1)[0]) if steps_key else None,
                          int(b[steps_key].reshape(-1)[0]) if steps_key and steps_key in b else None)
    out["lr_position_equal"] = steps_key is not None and out["lr_position"][0] == out["lr_position"][1]
    out["state_equal"] = bool(a) and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    out["scale_changed_before_ckpt"] = len(set(out["straight_loss_scale"][:n])) > 1
    out["crossed_warmup"] = cfg.warmup_steps < n
    out["bitwise"] = all(out[f"{k}_equal"] for k in ("loss", "lr", "loss_scale", "overflow", "data_pos",
                                                     "lr_position", "state"))
    return out


def ablation_run(cfg_yaml: str, steps: int, csv_dir: str, seed: int = 0, peak_flops: float | None = None,
                 resume_seed: int | None = None, resume_n: int = 6, context: dict | None = None,
                 log_dir: str | None = None, compile_cache: str | None = None) -> dict[str, Any]:
    """One run of one config and seed, meant for a fresh process (`timing.compare_interleaved`).

    Returns the run's summary (health, efficiency, stability) with `peak_mem_mb` taken at the
    run's last step, before anything else runs in the process. When seed == resume_seed it also
    runs `resume_check` on the same config (warm-up 2 steps, a dynamic loss scale that starts high
    enough to overflow, so the scale changes before the checkpoint).
    `context` is passed to `ms.set_context` first, for levers that are context settings rather than
    RunConfig fields, e.g. {"jit_config": {"jit_level": "O1"}} (graph-kernel fusion is an environment
    variable, MS_DEV_GRAPH_KERNEL_FLAGS, given to the fresh process). `log_dir` (fresh processes only)
    becomes the working folder and receives the process's stdout/stderr as <name>-s<seed>.log.
    `compile_cache` (fresh processes only): a folder under which the training graph's MindSpore compile cache
    is kept, one subfolder per graph (the config without seed and name, the context, MindSpore's
    version), so the second seed of a config skips most of its compile. Graph mode with grad_accum = 1 only
    (accumulation's steps are ms.jit functions, unsafe on a warm cache); the resume check compiles uncached.
    Taught in notebooks/09_evaluation_report.ipynb.
    """
    if __package__:
        from .config import RunConfig
        from .train import compile_cache as cached, train
    else:  # copied beside its siblings as plain files
        from config import RunConfig
        from train import compile_cache as cached, train
    cfg = RunConfig.from_yaml(cfg_yaml).replace(seed=seed)
    csv_dir = str(Path(csv_dir).resolve())       # before a chdir to log_dir
    if log_dir:   # a fresh process only: its output (resume notes, AKG's per-kernel lines) and its cwd go there
        d = Path(log_dir).resolve()
        d.mkdir(parents=True, exist_ok=True)
        os.chdir(d)
        fd = os.open(d / f"{cfg.name}-s{seed}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    if context:
        import mindspore as ms
        ms.set_context(**context)
    with cached(cfg, compile_cache, context):
        h = train(cfg, steps=steps, csv_path=Path(csv_dir) / f"{cfg.name}-s{seed}.csv", progress=False,
                  peak_flops=peak_flops)
    # steady state: the second half of the steps. MindSpore's CPU runtime runs the first steps after the
    # compile slower (steps 2-5 about 1.3x steps 6-10 of the mini preset, whatever the lr warm-up: AMD EPYC,
    # 2026-12-03), so a median over steps 2..10 lands on that edge and jumps between runs
    s = h.summary(skip_first=max(1, len(h.rows) // 2))
    s["csv"] = str(h.csv_path)
    if resume_seed is not None and seed == resume_seed:
        # a start that overflows for a few steps: float32 overflows near 2**127; a float16 backward overflows
        # once scale / tokens exceeds 65504, i.e. from about 2**26 at 1024 tokens
        start = 2.0 ** 127 if cfg.compute_dtype == "float32" else 2.0 ** 28
        rc = cfg.replace(warmup_steps=2, dynamic_loss_scale=True, loss_scale=start)
        s["resume"] = resume_check(rc, resume_n, Path(csv_dir) / "resume" / cfg.name)
    return s


def choose_stack(table: Sequence[dict], layers: dict[str, Sequence[str]], baseline: str) -> tuple[list, dict]:
    """The optimized stack from measured verdicts: a change joins when it wins on some metric
    and regresses on none. Returns (kept names, {dropped name: reason}).
    Taught in notebooks/09_evaluation_report.ipynb."""
    kept, dropped = [], {}
    for row in table:
        if row["name"] == baseline:
            continue
        verdicts = {m: row.get(f"{m} verdict") for ms_ in layers.values() for m in ms_ if f"{m} verdict" in row}
        reg = [m for m, v in verdicts.items() if v == "regression"]
        win = [m for m, v in verdicts.items() if v == "win"]
        if win and not reg:
            kept.append(row["name"])
        else:
            dropped[row["name"]] = (f"regression on {', '.join(reg)}" if reg else
                                    "no metric clears the noise")
    return kept, dropped
