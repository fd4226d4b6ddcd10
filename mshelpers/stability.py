"""Loss and grad-norm spikes: a robust detector, for a training loop that rolls back and skips the bad data.

Example:
    >>> from mshelpers.stability import SpikeDetector
    >>> det = SpikeDetector(window=8, threshold=6.0, warmup=4)
    >>> curve = [5.0, 4.8, 4.7, 4.5, 4.45, 4.3, 4.25, 4.1]
    >>> [det.update(x) for x in curve]
    [False, False, False, False, False, False, False, False]
    >>> det.update(7.5), det.last_reason.split(":")[0]
    (True, 'loss 7.5 > trend 4.475 + 6.0 x robust sigma 0.03706')

The test is one-sided and robust: over the last `window` accepted values it fits a Theil-Sen line (the
median of pairwise slopes), takes the MAD (median absolute deviation) of the residuals around it, scales it
by 1.4826 into a standard-deviation estimate, and flags a value above max(trend, median) + threshold * sigma.
The line keeps a steadily falling loss from widening the noise estimate. Medians ignore the odd outlier that a mean and a standard deviation
would chase, and the one-sided test never flags a loss that falls faster than usual. Flagged values are not
added to the history, so a spike cannot raise its own bar.

Defaults, and why:
- window=20: long enough for a stable median and MAD, short enough that a straight line follows a decaying
  curve over it.
- threshold=6.0: a six-sigma excursion almost never happens by chance (for Gaussian noise about 1e-9 per
  step), while the loss spikes that hurt large runs are tens of sigmas.
- warmup=10: the first steps fall fast and the history is short; nothing is flagged before `warmup`
  accepted values.
- rel_floor=0.005: a curve that goes flat can have a MAD near 0; sigma never drops below 0.5 % of the
  median, so float rounding alone is never a spike.

`SpikeGuard` is train()'s use of the detector: a snapshot before each step, a rollback and a skipped batch on a
spike, its state beside each checkpoint. Copy this file alone: it needs only the standard library (and MindSpore,
imported when the guard rolls back).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any


# --- the spike detector ---
class SpikeDetector:
    """Flag a step whose loss (or grad norm) jumps above its recent trend: `update(loss, grad_norm) -> bool`.
    Taught in notebooks/10_stability.ipynb and notebooks/09_evaluation_report.ipynb."""

    def __init__(self, window: int = 20, threshold: float = 6.0, warmup: int = 10, rel_floor: float = 0.005) -> None:
        for name, v, lo in (("window", window, 3), ("warmup", warmup, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"SpikeDetector: {name}={v!r} is invalid; fix: pass an integer >= {lo}")
        for name, v in (("threshold", threshold), ("rel_floor", rel_floor)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"SpikeDetector: {name}={v!r} is invalid; fix: pass a finite number > 0")
        self.window, self.threshold, self.warmup, self.rel_floor = window, float(threshold), warmup, float(rel_floor)
        self.losses: deque = deque(maxlen=window)
        self.grad_norms: deque = deque(maxlen=window)
        self.accepted = 0
        self.last_reason = ""

    def _check(self, name: str, value: float, hist: deque, threshold: float | None = None) -> str:
        if len(hist) < 3:
            return ""
        k = self.threshold if threshold is None else threshold
        ys = list(hist)
        n = len(ys)
        # the recent trend: a Theil-Sen line (median of pairwise slopes), so a steadily falling loss does not
        # widen the noise estimate; the MAD of the residuals around it is the noise
        slope = statistics.median((ys[j] - ys[i]) / (j - i) for i in range(n) for j in range(i + 1, n))
        icept = statistics.median(y - slope * x for x, y in enumerate(ys))
        resid = [y - (icept + slope * x) for x, y in enumerate(ys)]
        trend = icept + slope * n                      # where the trend says this step should be
        med = statistics.median(ys)
        sigma = max(1.4826 * statistics.median(abs(r - statistics.median(resid)) for r in resid),
                    self.rel_floor * abs(med))
        bar = max(trend, med) + k * sigma              # never below the median: a trend is not a licence
        return (f"{name} {value:.4g} > trend {max(trend, med):.4g} + {k} x robust sigma {sigma:.4g}"
                if value > bar else "")

    def update(self, loss: float, grad_norm: float | None = None) -> bool:
        """True when this step is a spike. A non-finite loss or grad norm is always a spike (after warm-up too)."""
        loss = float(loss)
        gn = None if grad_norm is None else float(grad_norm)
        self.last_reason = ""
        if not math.isfinite(loss) or (gn is not None and not math.isfinite(gn)):
            self.last_reason = f"non-finite: loss {loss}, grad norm {gn}"
            return True
        if self.accepted >= self.warmup:
            # A grad-norm jump alone is common on clean data (29 robust sigmas in the cookbook's clean control
            # run), so it counts only together with a loss at least half-way to the threshold.
            self.last_reason = self._check("loss", loss, self.losses) or (
                self._check("grad norm", gn, self.grad_norms)
                if gn is not None and self._check("loss", loss, self.losses, self.threshold / 2) else "")
            if self.last_reason:
                return True
        self.losses.append(loss)
        if gn is not None:
            self.grad_norms.append(gn)
        self.accepted += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to flag exactly the steps an uninterrupted one would."""
        return {"window": self.window, "threshold": self.threshold, "warmup": self.warmup,
                "rel_floor": self.rel_floor, "losses": list(self.losses), "grad_norms": list(self.grad_norms),
                "accepted": self.accepted}

    def load_state_dict(self, state: dict[str, Any]) -> "SpikeDetector":
        missing = {"losses", "grad_norms", "accepted"} - set(state)
        if missing:
            raise ValueError(f"SpikeDetector.load_state_dict: missing {sorted(missing)}; fix: pass a state_dict()")
        self.losses = deque((float(v) for v in state["losses"]), maxlen=self.window)
        self.grad_norms = deque((float(v) for v in state["grad_norms"]), maxlen=self.window)
        self.accepted = int(state["accepted"])
        return self


# --- finding spikes in a finished run, and a poisoned corpus to test on ---
def find_spikes(values, **kwargs: Any) -> list[int]:
    """0-based indices that a fresh SpikeDetector(**kwargs) flags in a sequence of losses.
    Taught in notebooks/09_evaluation_report.ipynb."""
    det = SpikeDetector(**kwargs)
    return [i for i, v in enumerate(values) if det.update(v)]


_WORDS = ("the of and to in is was that for it with as on be at by this had not are but from or have an they "
          "which one you were all we her she there would their will when who him been has more if no out so "
          "said what up its about than into them can only other new some could time these two may then do "
          "first any my now such like our over man me even most made after also did many before must through "
          "back years where much your way well down should because each just those people how too little state "
          "good very make world still own see men work long get here between both life being under never day "
          "same another know while last might us great old year off come since against go came right used take "
          "three").split()


def write_text_corpus(path, n_bytes: int = 200_000, seed: int = 0, poison: float = 0.0,
                      poison_at: float = 0.5) -> dict[str, Any]:
    """Write a byte-level training text (word sentences, Zipf-distributed) with an optional poisoned region.

    `poison` is the share of the file replaced by uniformly random bytes, starting at `poison_at` of the
    file: a stand-in for the corrupted shard or the garbage document that sets off a loss spike. The same
    seed gives the same clean text with or without poison, so a clean control run sees the same corpus
    minus the damage. Returns {"path", "bytes", "poison_start", "poison_end"}.
    Taught in notebooks/10_stability.ipynb.
    """
    import random
    from pathlib import Path
    if not 0 <= poison < 0.5 or not 0 <= poison_at < 1:
        raise ValueError(f"write_text_corpus: poison={poison}, poison_at={poison_at}; fix: 0 <= poison < 0.5, "
                         "0 <= poison_at < 1")
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(_WORDS))]
    out, size = [], 0
    while size < n_bytes:
        words = rng.choices(_WORDS, weights, k=rng.randint(4, 14))
        s = " ".join(words).capitalize() + ". "
        out.append(s)
        size += len(s)
    data = bytearray("".join(out).encode()[:n_bytes])
    start = end = int(poison_at * n_bytes)
    if poison:
        end = start + int(poison * n_bytes)
        noise = random.Random(seed + 1)
        data[start:end] = bytes(noise.randrange(256) for _ in range(end - start))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(bytes(data))
    return {"path": p, "bytes": len(data), "poison_start": start, "poison_end": end}


# --- the spike guard: roll back, skip the batch, redo the step ---
class SpikeStorm(RuntimeError):
    """The spike guard rolled back too often in a short span: the run needs a person, not another retry.
    Taught with the rest of stability.py in notebooks/10_stability.ipynb."""


class SpikeGuard:
    """In-memory rollback for `train.train` (cfg.spike_guard): a snapshot before every step, restored when the
    step spikes.

    The flagged step's batch is skipped (its data position is recorded), and the step is redone on the
    next batch. The detector state and the record of rollbacks go into a JSON file beside each checkpoint
    (`step_N.guard.json`), so a resumed run flags and skips exactly what an uninterrupted one would.
    MAX_ROLLBACKS rollbacks within WITHIN steps stop the run with SpikeStorm instead of looping.
    `cfg` needs spike_window and spike_threshold; MindSpore is imported only to roll back.
    Taught in notebooks/10_stability.ipynb.
    """
    MAX_ROLLBACKS, WITHIN = 5, 50   # ~1 % of batches poisoned gave 1-3 rollbacks per 50 steps here

    def __init__(self, cfg, net, optimizer, loss_scaler) -> None:
        self.detector = SpikeDetector(window=cfg.spike_window, threshold=cfg.spike_threshold,
                                      warmup=min(10, cfg.spike_window))
        state: dict = {}
        for cell in (net, optimizer):
            for p in cell.get_parameters():
                state.setdefault(p.name, p)
        for attr in ("scale_value", "counter"):
            if hasattr(loss_scaler, attr):
                state[f"loss_scaler.{attr}"] = getattr(loss_scaler, attr)
        self.params = list(state.values())
        self.saved: list = []
        self.events: list[dict] = []

    def snapshot(self) -> None:
        self.saved = [p.asnumpy().copy() for p in self.params]

    def is_spike(self, loss: float, grad_norm: float) -> bool:
        return self.detector.update(loss, grad_norm)

    def roll_back(self, step: int, loss: float, grad_norm: float, skipped: int) -> None:
        import mindspore as ms
        for p, a in zip(self.params, self.saved):
            # assign writes into the parameter's own buffer; set_data would swap in a new one that an
            # already compiled graph never sees
            ms.ops.assign(p, ms.Tensor(a))
        ev = {"step": step, "loss": loss, "grad_norm": grad_norm, "trigger": self.detector.last_reason,
              "skipped_data_pos": skipped}
        self.events.append(ev)
        print(f"rolled back step {step}: {ev['trigger']}; skipped data position {skipped}; redoing step {step} "
              "on the next batch", flush=True)
        recent = [e["step"] for e in self.events if e["step"] > step - self.WITHIN]
        if len(recent) >= self.MAX_ROLLBACKS:
            raise SpikeStorm(f"spike guard: {len(recent)} rollbacks within {self.WITHIN} steps (steps {recent}, "
                             f"skipped data positions {[e['skipped_data_pos'] for e in self.events[-len(recent):]]}); "
                             "fix: lower lr or inspect those batches rather than skipping more")

    def state(self) -> str:
        import json
        return json.dumps({"detector": self.detector.state_dict(), "events": self.events})

    def save(self, ckpt_path, state: str | None = None) -> None:
        import os
        from pathlib import Path
        path = Path(ckpt_path).with_suffix(".guard.json")
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        try:
            tmp.write_text(self.state() if state is None else state)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        for stale in path.parent.glob("step_*.guard.json"):   # sidecars whose checkpoint was pruned
            if not stale.with_name(stale.name.replace(".guard.json", ".ckpt")).exists():
                stale.unlink(missing_ok=True)

    def load(self, ckpt_path) -> None:
        import json
        from pathlib import Path
        path = Path(ckpt_path).with_suffix(".guard.json")
        if path.exists():
            state = json.loads(path.read_text())
            self.detector.load_state_dict(state["detector"])
            self.events[:] = state["events"]
