"""Read a training log for the config doctor: per-step times, the log's own throughput, MFU.

    python -m mshelpers.doctor CONFIG.yaml --log FILE

FILE is either a mindformers training log (stdout, msrun's worker_N.log, or output/log/rank_N/info.log)
or the cookbook's own metrics.csv. Standard library only: no MindSpore, no mindformers, no mshelpers.

The mindformers step lines, as the code prints them (mindformers 1.9.0 and 2.1.0 print the same
MFLossMonitor lines; 2.1.0 only changed the pynative LossCallback):

1. mindformers/core/callback/callback.py, MFLossMonitor.print_output_info (1.9.0 lines 747-765, 2.1.0 the
   same lines), two logger.info calls per printed step:
       { Epoch:[%3d/%3d], step:[%5d/%5d], <loss>[<separate losses>]per_step_time: %dms, lr: %s,
         overflow cond: %s, loss_scale: %s, global_norm: %s[, train_throughput_per_npu: %.3fT]
       "  %4.1f%% |<50-char bar>| %.5f samples/s/p  H:MM:SS }"
   <loss> is "loss:[%5.6f/%5.6f], " (this step / running mean of the epoch) without dataset sinking and
   "loss: %5.6f, " with it; "lr: %s, " is left out when the monitor has no learning rate (or a schedule on
   CPU); the separate losses ("lm_loss: ..., load_balancing_loss: ..., mtp_loss: ..., indexer_loss: ...")
   appear with print_separate_loss. overflow is "False" unless the train cell returned a true flag;
   loss_scale is "unavailable" when the cell returned none; global_norm is "None" when it returned none.
   step is the step within the epoch (on_train_step_end: (cur_step_num + initial_step - 1) %
   steps_per_epoch + 1); the global step is (epoch - 1) * steps_per_epoch + step. per_step_time is a whole
   number of milliseconds (%d). samples/s/p is global_batch_size / device_num / step seconds, with the
   global_batch_size the monitor was given (0 by default, which prints 0.00000).
   train_throughput_per_npu is model TFLOP/s per device (full_model_flops / per_step_ms / 1e9), printed only
   when mindformers could count the model's FLOPs (graph mode).
2. mindformers/pynative/callback/loss_callback.py, LossCallback._print_log (the pynative trainer):
       1.9.0: { step:[%5d/%5d], loss: %10.6f, per_step_time: %6dms[, lr: %10.6e], grad_norm: %10.6f|NaN,
                throughput: %6.2fT }
       2.1.0: { step:[%5d/%5d], consumed_samples: N, global_batch_size: N, loss: %10.6f|N/A (...),
                per_step_time: %6dms[, load_balancing_loss: ..][, indexer_loss: ..][, mtp_1_loss: ..]
                [, lr: %10.6e], grad_norm: %10.6f|NaN, throughput: %6.2fT }
   step is global. The 2.1.0 throughput is TFLOP/s per device (total_flops / (ms * 1e9 * world)); 1.9.0
   divided by ms * 1e12, so its "T" figure is 1000x too small: it is scaled back here, with a note.
Logger prefixes (mindformers/tools/logger.py): stdout "%(asctime)s - mindformers<LOG_MF_PATH>[<file>:<line>]
- INFO - <message>", rank_N/info.log "[INFO] %(asctime)s [<file>:<line>] print_output_info: <message>".
Lines are found by their content (step:[a/b] plus per_step_time), so any prefix works; a rank tag at the
start of a line (OpenMPI "[1,3]<stdout>:", grep -H "worker_3.log:" or "rank_3/info.log:", "[rank3]:")
is read as the rank.

The cookbook's metrics.csv (mshelpers/metrics.py COLUMNS, written by StepLogger and `python -m
mshelpers.train`): step, loss, lr, grad_norm, step_time_s, tokens_per_s (global, all devices), mfu,
peak_mem_mb, overflow, loss_scale, spike.

Every error is a LogError (a ValueError) of one line: "doctor --log: <field>=<value>; fix: <how>".
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import statistics
from typing import Any


class LogError(ValueError):
    """Bad log input, in one line: "doctor --log: <field>=<value>; fix: <how>".
    Taught in: no notebook; doctor/cli.py calls it."""

    def __init__(self, field: str, value: Any, fix: str) -> None:
        self.field, self.value, self.fix = field, value, fix
        shown = " ".join(str(value).split())[:120]
        super().__init__(f"doctor --log: {field}={shown}; fix: {fix}")


# ---------------------------------------------------------------- mindformers lines
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STEP = re.compile(r"(?:Epoch:\[\s*(?P<epoch>\d+)\s*/\s*(?P<epochs>\d+)\s*\],\s*)?"
                  r"step:\[\s*(?P<step>\d+)\s*/\s*(?P<steps>\d+)\s*\],(?P<rest>.*per_step_time:.*)")
PROGRESS = re.compile(r"(?P<percent>[\d.]+)%\s*\|[^|]*\|\s*(?P<sps>\S+) samples/s/p")
RANK_TAG = re.compile(r"^(?:\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:"      # mpirun --tag-output
                      r"|\S*?worker_(?P<worker>\d+)\.log[:-]"            # grep -H over msrun_log/worker_N.log
                      r"|\S*?rank_(?P<rankdir>\d+)/\S*?\.log[:-]"        # grep -H over log/rank_N/info.log
                      r"|\[?rank\s?(?P<rank>\d+)\]?:)")                  # "[rank3]:" / "rank3:"
FIELD = {  # record key: pattern on the text after step:[a/b],
    "loss_pair": re.compile(r"(?<!\w)loss:\s*\[\s*([^/\]]+)/([^\]]+)\]"),
    "loss": re.compile(r"(?<!\w)loss:\s*(N/A|[^,\s}]+)"),
    "per_step_time_ms": re.compile(r"per_step_time:\s*(-?\d+)\s*ms"),
    "lr": re.compile(r"(?<!\w)lr:\s*([^,}]+)"),
    "overflow": re.compile(r"overflow cond:\s*([^,}]+)"),
    "loss_scale": re.compile(r"loss_scale:\s*([^,}]+)"),
    "global_norm": re.compile(r"(?:global_norm|grad_norm):\s*([^,}]+)"),
    "train_throughput_per_npu": re.compile(r"train_throughput_per_npu:\s*([^,}\sT]+)T"),
    "pynative_throughput": re.compile(r"(?<!_)throughput:\s*([^,}\sT]+)T"),
    "consumed_samples": re.compile(r"consumed_samples:\s*(\d+)"),
    "global_batch_size": re.compile(r"global_batch_size:\s*(\d+)"),
}


def _num(text: str | None) -> float | None:
    """A number from a printed field: '0.01', '[0.001]', '1024.0', 'nan'; None for None/unavailable/N/A."""
    if text is None:
        return None
    text = text.strip().strip("[]").strip()
    try:
        return float(text)
    except ValueError:
        return None


def _flag(text: str | None) -> bool | None:
    if text is None:
        return None
    text = text.strip().strip("[]").strip().lower()
    return {"true": True, "false": False, "1": True, "0": False}.get(text)


def _read_lines(path_or_lines: Any, what: str) -> tuple[list[str], str]:
    """(lines, name): from a path (bytes decoded as UTF-8, bad bytes replaced) or from an iterable of str."""
    if isinstance(path_or_lines, (str, os.PathLike)) and not (isinstance(path_or_lines, str) and "\n" in path_or_lines):
        path = os.fspath(path_or_lines)
        if not os.path.exists(path):
            raise LogError("file", path, f"pass the {what} written by the run (check the path)")
        if os.path.isdir(path):
            raise LogError("file", path, "pass a file, not a folder (e.g. output/log/rank_0/info.log "
                                         "or the run's metrics.csv)")
        data = open(path, "rb").read()
        if not data.strip():
            raise LogError("file", path, f"the file is empty: pass the {what} of a run that printed steps")
        text = data.decode("utf-8", errors="replace")
        return text.splitlines(keepends=True), path
    if isinstance(path_or_lines, str):
        return path_or_lines.splitlines(keepends=True), "<text>"
    return [str(x) for x in path_or_lines], "<lines>"


def _looks_binary(lines: list[str]) -> float:
    """Share of characters that are not text (NUL, control, U+FFFD from undecodable bytes)."""
    text = "".join(lines)[:65536]
    if not text:
        return 0.0
    bad = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and c not in "\t\n\r\x1b"))
    return bad / len(text)


def _complete(line: str) -> bool:
    """A step line that was written to its end: MFLossMonitor's ends with global_norm's value, the
    pynative LossCallback's with '}'."""
    return bool(re.search(r"global_norm: \S", line)) or line.rstrip().endswith("}")


def _parse_step_line(m: re.Match, number: int, rank: int | None, notes_1_9: list) -> dict:
    rest = m.group("rest")
    got = {k: p.search(rest) for k, p in FIELD.items()}
    first = lambda k: got[k].group(1) if got[k] else None  # noqa: E731
    epoch, epochs = m.group("epoch"), m.group("epochs")
    step, steps = int(m.group("step")), int(m.group("steps"))
    rec: dict[str, Any] = {"line": number, "rank": rank}
    if epoch is not None:      # MFLossMonitor: step within the epoch
        rec.update(callback="MFLossMonitor", epoch=int(epoch), epochs=int(epochs), step_in_epoch=step,
                   steps_per_epoch=steps, step=(int(epoch) - 1) * steps + step)
    else:                      # pynative LossCallback: step is global
        rec.update(callback="LossCallback", epoch=None, step=step, max_steps=steps)
    if got["loss_pair"]:
        rec["loss"], rec["epoch_mean_loss"] = _num(got["loss_pair"].group(1)), _num(got["loss_pair"].group(2))
    else:
        rec["loss"] = _num(first("loss"))
    rec["per_step_time_s"] = int(first("per_step_time_ms")) / 1000.0
    rec["lr"] = _num(first("lr"))
    if got["overflow"]:
        rec["overflow"] = _flag(first("overflow"))
    if got["loss_scale"]:
        rec["loss_scale"] = _num(first("loss_scale"))
    rec["global_norm"] = _num(first("global_norm"))
    if got["train_throughput_per_npu"]:
        rec["model_tflops_per_device"] = _num(first("train_throughput_per_npu"))
    elif got["pynative_throughput"]:
        value = _num(first("pynative_throughput"))
        if got["consumed_samples"] is None and value is not None:   # 1.9.0: divided by ms * 1e12
            value *= 1000.0
            notes_1_9.append(number)
        rec["model_tflops_per_device"] = value
    for k in ("consumed_samples", "global_batch_size"):
        if got[k]:
            rec[k] = int(first(k))
    return rec


def _one_run(recs: list[dict], notes: list[str]) -> list[dict]:
    """The last run's steps, each step once. Steps going back start a new run (a resume or a restart, or
    several ranks' logs one after another); a step printed again at the newest step or the one before is
    another rank's copy (ranks interleaved without a tag): the first line is kept. A resume that goes back
    by one step only is read as a copy too: its compile step is then the one dropped."""
    runs: list[list[dict]] = [[]]
    seen: set[int] = set()
    top, copies = 0, [0]
    for r in recs:
        s = r["step"]
        if s > top:
            runs[-1].append(r)
        elif s in seen and s >= top - 1:
            copies[-1] += 1
            continue
        else:
            runs.append([r])
            copies.append(0)
            seen = set()
        seen.add(s)
        top = s
    kept, dups = runs[-1], copies[-1]
    if len(runs) > 1:
        dropped = sum(len(x) for x in runs[:-1])
        notes.append(f"steps went back {len(runs) - 1} time{'s' if len(runs) > 2 else ''} (a resumed or restarted "
                     f"run, or several ranks' logs one after another): kept the last run, lines "
                     f"{kept[0]['line']}-{kept[-1]['line']}, steps {kept[0]['step']}-{kept[-1]['step']}; "
                     f"dropped {dropped} earlier step line{'s' if dropped > 1 else ''}")
    if dups:
        if dups * 2 >= len(kept):
            notes.append(f"most steps are printed {round(1 + dups / len(kept))} times: lines of several ranks "
                         f"interleaved without a rank tag; kept the first line of each step ({dups} copies dropped)")
        else:
            notes.append(f"dropped {dups} repeated step line{'s' if dups > 1 else ''} (kept the first of each)")
    return kept


def parse_mindformers_log(path_or_lines: Any, notes: list[str] | None = None) -> list[dict]:
    """One dict per step line of a mindformers training log, for one rank and the last run.

    path_or_lines: a path, the log's text, or an iterable of lines. Keys: line (1-based line number in
    the input), rank (from a rank tag, else None), callback ("MFLossMonitor" or "LossCallback"), step
    (global), epoch, loss, per_step_time_s, lr, overflow, loss_scale, global_norm (None when not printed),
    samples_per_s_p (MFLossMonitor's progress line; None when it printed 0), model_tflops_per_device
    (train_throughput_per_npu / throughput), and epoch_mean_loss, step_in_epoch, steps_per_epoch,
    consumed_samples, global_batch_size when printed. Non-step lines are ignored.
    What was repaired or chosen (torn last line, ranks, a resume) is appended to `notes` when given.
    Raises LogError when nothing in the input is a step line.
    Taught with the rest of doctor/logs.py in notebooks/12_your_config.ipynb.
    """
    notes = [] if notes is None else notes
    lines, name = _read_lines(path_or_lines, "mindformers training log")
    if lines and not lines[-1].endswith(("\n", "\r")) and STEP.search(lines[-1]) and not _complete(lines[-1]):
        notes.append(f"dropped a torn last line (line {len(lines)}: {lines[-1].strip()[:60]!r}...)")
        lines = lines[:-1]
    recs: list[dict] = []
    waiting: dict[int | None, list[dict]] = {}    # per rank: step lines still without their progress line
    pynative_1_9: list[int] = []
    for number, raw in enumerate(lines, start=1):
        line = ANSI.sub("", raw).replace("\x00", "").strip()
        if not line:
            continue
        tag = RANK_TAG.match(line)
        rank = next((int(g) for g in tag.groups() if g is not None), None) if tag else None
        m = STEP.search(line)
        if m:
            if FIELD["per_step_time_ms"].search(m.group("rest")) is None:
                continue
            rec = _parse_step_line(m, number, rank, pynative_1_9)
            rec["samples_per_s_p"] = None
            recs.append(rec)
            if rec["callback"] == "MFLossMonitor":
                waiting[rank] = (waiting.get(rank, []) + [rec])[-4:]
            continue
        p = PROGRESS.search(line)
        if p and waiting.get(rank):       # the progress line follows its step line (or a near one, interleaved)
            prev = waiting[rank].pop()
            sps = _num(p.group("sps"))
            prev["samples_per_s_p"] = sps if sps else None   # 0.00000: the monitor had no global_batch_size
            prev["progress_line"] = number
    if not recs:
        share = _looks_binary(lines)
        if share > 0.3:
            raise LogError("content", f"binary ({share:.0%} non-text characters in {name})",
                           "pass the text log (output/log/rank_0/info.log, msrun_log/worker_0.log) or metrics.csv")
        raise LogError("step_lines", f"0 in {name} ({len(lines)} lines)",
                       "pass the log of a training run: mindformers prints one '{ Epoch:[..], step:[..], loss: "
                       "..., per_step_time: ...ms' line per step (MFLossMonitor; check per_print_times)")
    if pynative_1_9:
        notes.append("the pynative LossCallback of mindformers 1.9.0 prints throughput 1000x too small "
                     "(total_flops / (ms * 1e12)); model_tflops_per_device is scaled back by 1000")
    ranks = sorted({r["rank"] for r in recs if r["rank"] is not None})
    if ranks:
        count = {k: sum(1 for r in recs if r["rank"] == k) for k in ranks}
        keep = max(ranks, key=lambda k: (count[k], -k))
        untagged = sum(1 for r in recs if r["rank"] is None)
        if len(ranks) > 1 or untagged:
            notes.append(f"step lines of ranks {ranks}{f' and {untagged} without a rank tag' if untagged else ''}: "
                         f"kept rank {keep} ({count[keep]} lines)")
        recs = [r for r in recs if r["rank"] == keep]
    recs = _one_run(recs, notes)
    zero = [r["step"] for r in recs if r["per_step_time_s"] == 0]
    if zero:
        notes.append(f"{len(zero)} step{'s' if len(zero) > 1 else ''} printed per_step_time: 0ms (the log rounds "
                     f"down to whole ms), e.g. step {zero[0]}")
    if any(r["loss"] is not None and math.isnan(r["loss"]) for r in recs):
        notes.append("the loss is NaN on some steps (timing is still read)")
    return recs


# ---------------------------------------------------------------- the cookbook's metrics.csv
CSV_NEEDS = ("step", "step_time_s")
CSV_FLOATS = ("loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu", "peak_mem_mb", "loss_scale")


def read_metrics_csv(path: Any, notes: list[str] | None = None) -> list[dict]:
    """Rows of the cookbook's metrics.csv (mshelpers/metrics.py COLUMNS; StepLogger, `python -m
    mshelpers.train`), as records with the mindformers keys: line, step, loss, per_step_time_s (from
    step_time_s), lr, global_norm (from grad_norm), overflow, loss_scale, plus tokens_per_s (global, all
    devices), mfu, peak_mem_mb, spike. A torn last line is dropped; steps going back keep the last run.
    Taught with the rest of doctor/logs.py in notebooks/12_your_config.ipynb.
    """
    notes = [] if notes is None else notes
    lines, name = _read_lines(path, "metrics.csv")
    lines = [ln.replace("\x00", "") for ln in lines]
    if lines and not lines[-1].endswith(("\n", "\r")) and len(lines) > 1:
        header_n = len(next(csv.reader([lines[0]])))
        if len(next(csv.reader([lines[-1]]), [])) != header_n or not lines[-1].strip():
            notes.append(f"dropped a torn last line (line {len(lines)}: {lines[-1].strip()[:40]!r})")
            lines = lines[:-1]
    reader = csv.reader(io.StringIO("".join(lines)))
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in CSV_NEEDS if c not in header]
    if missing:
        raise LogError("columns", header[:12], f"metrics.csv needs {list(CSV_NEEDS)} (missing {missing}); pass "
                                               "the metrics.csv written by `python -m mshelpers.train` or StepLogger")
    recs, bad = [], []
    for number, vals in enumerate(reader, start=2):
        if not any(v.strip() for v in vals):
            continue
        if len(vals) != len(header):
            bad.append(number)
            continue
        row = dict(zip(header, (v.strip() for v in vals)))
        try:
            step = int(float(row["step"]))
        except ValueError:
            bad.append(number)
            continue
        rec: dict[str, Any] = {"line": number, "rank": None, "step": step}
        for k in CSV_FLOATS:
            if k in row:
                rec[k] = _num(row[k])
        for k in ("overflow", "spike"):
            if k in row:
                rec[k] = _flag(row[k])
        rec["per_step_time_s"] = rec.pop("step_time_s")
        if rec["per_step_time_s"] is None:
            raise LogError("step_time_s", f"{row['step_time_s']!r} at line {number} of {name}",
                           "each row needs a number of seconds in step_time_s")
        rec["global_norm"] = rec.pop("grad_norm", None)
        recs.append(rec)
    if bad:
        notes.append(f"dropped {len(bad)} malformed row{'s' if len(bad) > 1 else ''} (lines {bad[:5]})")
    if not recs:
        raise LogError("rows", f"0 in {name}", "the CSV has a header but no step rows: pass a run's metrics.csv "
                                               "after at least one step")
    return _one_run(recs, notes)


# ---------------------------------------------------------------- sniffing
def read_training_log(path: Any) -> dict:
    """{"format": "mindformers" | "metrics.csv", "steps": [records], "notes": [str]}.

    A file whose first non-blank line is a CSV header of plain names (step, loss, step_time_s, ...) is a
    metrics.csv; anything else is read as a mindformers log.
    Taught in: no notebook; doctor/cli.py calls it.
    """
    lines, _ = _read_lines(path, "training log (mindformers log or metrics.csv)")
    first = next((ANSI.sub("", ln).strip() for ln in lines if ln.strip()), "")
    cells = [c.strip() for c in first.split(",")]
    notes: list[str] = []
    if len(cells) >= 2 and all(re.fullmatch(r"[A-Za-z_][\w/ .-]*", c) for c in cells) and not STEP.search(first):
        return {"format": "metrics.csv", "steps": read_metrics_csv(path, notes), "notes": notes}
    return {"format": "mindformers", "steps": parse_mindformers_log(path, notes), "notes": notes}


# ---------------------------------------------------------------- what the steps say
def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, med, q3


def _check_times(records: list[dict]) -> None:
    if not records:
        raise LogError("steps", 0, "pass the records of read_training_log(...)['steps'] (at least 2 steps)")
    for r in records:
        t = r.get("per_step_time_s")
        if not isinstance(t, (int, float)) or isinstance(t, bool) or math.isnan(t) or t <= 0:
            why = ("steps faster than the log's 1 ms resolution cannot be timed from it: time a bigger step"
                   if t == 0 else "every step time must be a positive number of seconds; check that line")
            raise LogError("per_step_time_s", f"{t} at step {r.get('step')} (line {r.get('line')})", why)


# Fewer steady steps than this and the median is one or two steps' luck (a log cut short after compiling):
# it is still scored, with a one-line note saying so.
MIN_STEADY = 5


def steady_step_time(records: list[dict], skip: int | None = None) -> dict:
    """Median step time over the steady steps, with quartiles and what was left out.

    Leaves out the first `skip` steps (default max(1, 10% of them): compile and warm-up), then any step
    slower than 3x the median of the rest (a checkpoint save, an evaluation, a hiccup).
    Returns median_s, q1_s, q3_s, steps_used, skipped_warmup, skipped_slow, first_step_s (the compile
    step), used (the step numbers used), notes (one line when fewer than MIN_STEADY steps are used).
    Taught with the rest of doctor/logs.py in notebooks/12_your_config.ipynb.
    """
    _check_times(records)
    n = len(records)
    if n < 2:
        raise LogError("steps", n, "a steady step time needs at least 2 steps (the first is compile and "
                                   "warm-up): train longer or log every step (per_print_times: 1)")
    if skip is None:
        skip = max(1, n // 10)
    if not isinstance(skip, int) or isinstance(skip, bool) or not 0 <= skip < n:
        raise LogError("skip", skip, f"pass a whole number of leading steps to leave out, 0..{n - 1}")
    rest = records[skip:]
    cut = 3 * statistics.median(r["per_step_time_s"] for r in rest)
    used = [r for r in rest if r["per_step_time_s"] <= cut]
    q1, med, q3 = _quartiles([r["per_step_time_s"] for r in used])
    notes = []
    if len(used) < MIN_STEADY:
        slow = f" and {len(rest) - len(used)} slower than 3x the median" if len(rest) > len(used) else ""
        notes.append(f"only {len(used)} steady step{'s' if len(used) != 1 else ''} of {n} after leaving out "
                     f"{skip} warm-up{slow}: fewer than {MIN_STEADY}, so the measured figure is not a steady "
                     "median; train longer or log every step (per_print_times: 1)")
    return {"median_s": med, "q1_s": q1, "q3_s": q3, "steps_used": len(used), "skipped_warmup": skip,
            "skipped_slow": len(rest) - len(used), "first_step_s": records[0]["per_step_time_s"],
            "used": [r["step"] for r in used], "notes": notes}


def _positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or math.isinf(v) or v <= 0:
        raise LogError(name, v, f"pass {name} as a number > 0")
    return float(v)


def measured_throughput(records: list[dict], *, global_batch: int, seq_len: int, devices: int,
                        skip: int | None = None) -> dict:
    """tokens/s/p at the steady median step time: global_batch * seq_len / (step_time * devices), with
    the range from the quartiles, and beside it the log's own figure when it printed one:
    MFLossMonitor's samples/s/p x seq_len, metrics.csv's tokens_per_s / devices, and the model TFLOP/s per
    device (train_throughput_per_npu / throughput), medians over the same steps. `skip` as in
    steady_step_time, whose result is under "step_time" and whose notes start "notes".
    Taught in: no notebook; doctor/cli.py calls it.
    """
    for name, v in (("global_batch", global_batch), ("seq_len", seq_len), ("devices", devices)):
        _positive(name, v)
    steady = steady_step_time(records, skip=skip)
    tokens = global_batch * seq_len
    per = lambda t: tokens / (t * devices)  # noqa: E731
    out = {"tokens_per_s_per_device": per(steady["median_s"]),
           "tokens_per_s_per_device_range": (per(steady["q3_s"]), per(steady["q1_s"])),
           "step_time": steady, "log_tokens_per_s_per_device": None, "log_model_tflops_per_device": None,
           "notes": list(steady["notes"])}
    used = set(steady["used"])
    pick = lambda key: [r[key] for r in records  # noqa: E731
                        if r["step"] in used and isinstance(r.get(key), (int, float)) and r[key] == r[key]]
    sps, tps, tflops = pick("samples_per_s_p"), pick("tokens_per_s"), pick("model_tflops_per_device")
    if sps:
        out["log_tokens_per_s_per_device"] = statistics.median(sps) * seq_len
        out["log_source"] = "samples/s/p x seq_len (MFLossMonitor progress line)"
    elif tps:
        out["log_tokens_per_s_per_device"] = statistics.median(tps) / devices
        out["log_source"] = "tokens_per_s / devices (metrics.csv)"
    if tflops:
        out["log_model_tflops_per_device"] = statistics.median(tflops)
    logged = out["log_tokens_per_s_per_device"]
    if logged and abs(logged / out["tokens_per_s_per_device"] - 1) > 0.1:
        out["notes"].append(f"the log's own figure ({logged:.4g} tokens/s/p) differs by more than 10% from "
                            f"global_batch*seq_len/(step_time*devices) = {out['tokens_per_s_per_device']:.4g}: "
                            "check global_batch, seq_len and devices against the run (MFLossMonitor uses the "
                            "global_batch_size it was given)")
    return out


def mfu_from_log(tokens_per_s_per_device: float, *, n_params: int, n_active_params: int | None = None,
                 layers: int, heads: int, head_dim: int, seq_len: int, peak_flops: float,
                 hardware_flops_per_token: float | None = None) -> dict:
    """MFU of a measured tokens/s/p in three conventions, against `peak_flops` per device:
    6N (Kaplan; N = the active parameters when given, for MoE), 6N + 12*L*heads*head_dim*seq (PaLM,
    Chowdhery et al. 2022, appendix B) and hardware FLOPs per token (with recompute; when given).
    Taught with the rest of doctor/logs.py in notebooks/12_your_config.ipynb.
    """
    tps = _positive("tokens_per_s_per_device", tokens_per_s_per_device)
    for name, v in (("n_params", n_params), ("layers", layers), ("heads", heads), ("head_dim", head_dim),
                    ("seq_len", seq_len), ("peak_flops", peak_flops)):
        _positive(name, v)
    n = _positive("n_active_params", n_active_params) if n_active_params is not None else float(n_params)
    fpt_6n = 6 * n
    fpt_palm = fpt_6n + 12 * layers * heads * head_dim * seq_len
    out = {"n_used": n, "flops_per_token_6n": fpt_6n, "flops_per_token_palm": fpt_palm,
           "mfu_6n": tps * fpt_6n / peak_flops, "mfu_palm": tps * fpt_palm / peak_flops,
           "mfu_hardware": None, "notes": []}
    if hardware_flops_per_token is not None:
        out["mfu_hardware"] = tps * _positive("hardware_flops_per_token", hardware_flops_per_token) / peak_flops
    worst = max(v for k, v in out.items() if k.startswith("mfu_") and v is not None)
    if worst > 1:
        out["notes"].append(f"MFU {worst:.2f} > 1 is impossible: the peak is too low, the token rate too high "
                            "(global_batch, seq_len, devices) or the parameter count too large")
    return out
