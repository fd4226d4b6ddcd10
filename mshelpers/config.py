"""Run configuration: one dataclass that every helper and notebook shares.

Example:
    >>> from mshelpers.config import RunConfig
    >>> cfg = RunConfig.preset("mini").replace(steps=20, mode="graph")
    >>> cfg.validate() is cfg          # returns the config itself, so calls chain
    True
    >>> cfg.replace(amp_level="O4").validate()
    Traceback (most recent call last):
    ValueError: RunConfig.amp_level='O4' is invalid: use one of ('O0', 'O1', 'O2', 'O3')
    >>> RunConfig.from_yaml(cfg.to_yaml()) == cfg
    True

`validate()` checks every field before any MindSpore work starts and raises one
`ValueError` that names the field, the bad value and how to fix it.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

AMP_LEVELS = ("O0", "O1", "O2", "O3")
MODES = ("pynative", "graph")
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("float32", "float16", "bfloat16")


def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The cookbook's root (the folder holding pyproject.toml), or the cwd if none is found.
    Taught in notebooks/06_recompute_memory.ipynb."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / "pyproject.toml").exists() and (p / "mshelpers").is_dir():
            return p
    return here


def build_dir(*parts: str) -> Path:
    """`<repo>/build/<parts...>`, created on demand. `MSHELPERS_BUILD` overrides the root.
    Taught in notebooks/01_pynative_baseline.ipynb."""
    root = Path(os.environ.get("MSHELPERS_BUILD") or repo_root() / "build")
    p = root.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs. Sizes follow mindformers' LlamaConfig names.
    Taught in notebooks/00_environment.ipynb."""

    name: str = "mini"
    # model
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    ffn_hidden_size: int = 688
    vocab_size: int = 1024
    seq_len: int = 128
    # optimisation
    batch_size: int = 8          # global batch (sequences per step, summed over dp ranks)
    steps: int = 40
    lr: float = 3e-3
    warmup_steps: int = 5
    weight_decay: float = 0.0
    grad_clip: float = 1.0       # 0 disables clipping
    # execution
    mode: str = "pynative"       # "pynative" | "graph"
    compute_dtype: str = "float32"
    amp_level: str = "O0"
    loss_scale: float = 1.0      # 1.0 = off; > 1 = static scale, or the start value when dynamic
    dynamic_loss_scale: bool = False
    recompute: str = "none"      # "none" | "selective" | "full"
    # parallel
    dp: int = 1
    mp: int = 1
    pp: int = 1
    micro_batches: int = 1
    grad_accum: int = 1
    # stability: roll back and skip the batch when the loss or grad norm spikes (mshelpers.stability)
    spike_guard: bool = False
    spike_threshold: float = 6.0     # robust sigmas above the recent median
    spike_window: int = 20           # recent accepted steps the median and MAD are taken over
    # data and bookkeeping
    data: str = "markov"         # "markov" (synthetic, known floor) or a path to a text file
    seed: int = 0
    log_dir: str = "build/runs"

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str) -> "RunConfig":
        """Named configurations: "mini" trains on a laptop CPU, the LLaMA-2 ones are for planning."""
        presets = {
            # 3,688,704 parameters in mindformers' LlamaForCausalLM
            "mini": dict(),
            # a smaller sibling for unit tests and quick probes
            "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, ffn_hidden_size=172,
                         vocab_size=256, seq_len=32, batch_size=4, steps=10),
            # LLaMA-2 dimensions (Touvron et al. 2023, table 1 / the released config.json)
            "llama2-7b": dict(hidden_size=4096, num_layers=32, num_heads=32, ffn_hidden_size=11008,
                              vocab_size=32000, seq_len=4096, batch_size=64, compute_dtype="bfloat16",
                              amp_level="O2", mode="graph"),
            "llama2-13b": dict(hidden_size=5120, num_layers=40, num_heads=40, ffn_hidden_size=13824,
                               vocab_size=32000, seq_len=4096, batch_size=64, compute_dtype="bfloat16",
                               amp_level="O2", mode="graph"),
            "llama2-70b": dict(hidden_size=8192, num_layers=80, num_heads=64, ffn_hidden_size=28672,
                               vocab_size=32000, seq_len=4096, batch_size=64, compute_dtype="bfloat16",
                               amp_level="O2", mode="graph"),
        }
        if name not in presets:
            raise ValueError(f"RunConfig.preset: unknown preset {name!r}; "
                             f"fix: use one of {sorted(presets)}")
        return cls(name=name, **presets[name])

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with some fields changed; unknown field names raise a ValueError."""
        known = {f.name for f in fields(self)}
        bad = sorted(set(changes) - known)
        if bad:
            raise ValueError(f"RunConfig.replace: unknown field {bad[0]!r}; "
                             f"fix: use one of {sorted(known)}")
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------- derived
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def tokens_per_step(self) -> int:
        """Tokens the model is trained on per optimizer step (global, all dp ranks)."""
        return self.batch_size * self.seq_len * self.grad_accum

    # ---------------------------------------------------------- validation
    def validate(self) -> "RunConfig":
        """Raise one ValueError naming the field, the value and the fix; return self if fine."""
        def bad(field_name: str, fix: str) -> ValueError:
            return ValueError(f"RunConfig.{field_name}={getattr(self, field_name)!r} is invalid: {fix}")

        # Types first: YAML hands over whatever it parsed (`grad_clip: abc` is a str, `data: 123` an int).
        for f in fields(self):
            v, t = getattr(self, f.name), str(f.type)
            if t == "bool" and not isinstance(v, bool):
                raise bad(f.name, "must be true or false")
            if t == "int" and (not isinstance(v, int) or isinstance(v, bool)):
                raise bad(f.name, "must be an integer")
            if t == "float" and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
                raise bad(f.name, "must be a finite number")
            if t == "str" and not isinstance(v, str):
                raise bad(f.name, "must be a string")
        for f in ("hidden_size", "num_layers", "num_heads", "ffn_hidden_size", "vocab_size",
                  "seq_len", "batch_size", "steps", "dp", "mp", "pp", "micro_batches", "grad_accum"):
            if getattr(self, f) <= 0:
                raise bad(f, "must be a positive integer")
        if self.hidden_size % self.num_heads:
            raise bad("hidden_size", f"must be divisible by num_heads={self.num_heads}; "
                                     f"try {self.num_heads * max(1, self.hidden_size // self.num_heads)}")
        if (self.hidden_size // self.num_heads) % 2:
            raise bad("num_heads", "head_dim = hidden_size/num_heads must be even for rotary embeddings")
        if self.mode not in MODES:
            raise bad("mode", f"use one of {MODES}")
        if self.amp_level not in AMP_LEVELS:
            raise bad("amp_level", f"use one of {AMP_LEVELS}")
        if self.compute_dtype not in DTYPES:
            raise bad("compute_dtype", f"use one of {DTYPES}")
        if self.recompute not in RECOMPUTE:
            raise bad("recompute", f"use one of {RECOMPUTE}")
        if not self.lr > 0:
            raise bad("lr", "must be a positive number, e.g. 3e-3")
        if self.warmup_steps < 0:
            raise bad("warmup_steps", "must be an integer >= 0")
        if self.grad_clip < 0:
            raise bad("grad_clip", "must be >= 0 (0 disables clipping)")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        if self.loss_scale < 1:
            raise bad("loss_scale", "must be a number >= 1 (1 = no scaling); "
                                    "set dynamic_loss_scale=True for a dynamic scaler")
        if self.seed < 0:
            raise bad("seed", "must be >= 0")
        if not self.spike_threshold > 0:
            raise bad("spike_threshold", "must be a finite number > 0, e.g. 6.0")
        if self.spike_window < 3:
            raise bad("spike_window", "must be an integer >= 3, e.g. 20")
        if self.batch_size % (self.dp * self.micro_batches):
            raise bad("batch_size", f"must be divisible by dp*micro_batches = {self.dp}*{self.micro_batches}"
                                    f" = {self.dp * self.micro_batches}; "
                                    f"try batch_size={self.dp * self.micro_batches * max(1, self.batch_size // (self.dp * self.micro_batches))}")
        if self.num_heads % self.mp:
            raise bad("mp", f"must divide num_heads={self.num_heads}")
        if self.ffn_hidden_size % self.mp:
            raise bad("mp", f"must divide ffn_hidden_size={self.ffn_hidden_size}")
        if self.num_layers % self.pp:
            raise bad("pp", f"must divide num_layers={self.num_layers}")
        if self.data != "markov":
            # byte-level tokens: a file of n bytes holds n tokens, and one window needs seq_len + 1 of them
            p = Path(self.data)
            if not p.is_file():
                raise bad("data", "use 'markov' for the synthetic corpus or the path of an existing text file")
            if p.stat().st_size < self.seq_len + 1:
                raise bad("data", f"holds {p.stat().st_size} bytes, fewer than seq_len+1={self.seq_len + 1}; "
                                  "fix: use a longer file or a shorter seq_len")
            if self.vocab_size < 256:
                raise bad("vocab_size", "is too small for byte tokens of a text file; fix: use >= 256")
        return self

    def config_hash(self) -> str:
        """12 hex digits identifying the run's settings; `steps` is left out, so extending a run keeps it."""
        import hashlib
        import json
        d = {k: v for k, v in self.to_dict().items() if k != "steps"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    # ---------------------------------------------------------------- yaml
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """Build from a mapping; a `run` entry (the training CLI's run identity) is not a field and is ignored."""
        if not isinstance(d, dict):
            raise ValueError(f"RunConfig: expected a mapping of field: value, got {type(d).__name__}; "
                             "fix: write one `field: value` per line")
        d = {k: v for k, v in d.items() if k != "run"}
        known = {f.name for f in fields(cls)}
        bad = sorted(set(d) - known, key=str)
        if bad:
            raise ValueError(f"RunConfig: unknown field {bad[0]!r} in the input; fix: use one of {sorted(known)}")
        return cls(**d)

    def to_yaml(self, path: str | os.PathLike | None = None, run: dict | None = None) -> str:
        """Serialise to YAML (with an optional `run` identity entry first); also write it to `path` if given.

        The file is written to a temporary name and renamed, so a crash never leaves half a config.
        """
        import yaml
        head = yaml.safe_dump({"run": run}, sort_keys=False) if run else ""
        text = head + yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            path = Path(path)
            tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
            try:
                tmp.write_text(text)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        return text

    @staticmethod
    def read_yaml(text_or_path: str | os.PathLike) -> dict:
        """The mapping in YAML text or a .yaml file; one ValueError for unreadable, corrupt or non-mapping input."""
        import yaml
        s, where = str(text_or_path), "YAML text"
        if "\n" not in s and Path(s).is_file():
            where = s
            try:
                s = Path(s).read_text()
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start}); "
                                 "fix: restore the file or delete it and start a fresh run") from None
        try:
            d = yaml.safe_load(s)
        except yaml.YAMLError as e:
            first = " ".join(str(e).split())[:200]
            raise ValueError(f"{where}: not valid YAML ({first}); fix: repair the file or start a fresh run") from None
        if d is None:
            raise ValueError(f"{where} is empty; fix: restore it or start a fresh run")
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected `field: value` lines, got a {type(d).__name__}; "
                             "fix: restore it or start a fresh run")
        return d

    @classmethod
    def from_yaml(cls, text_or_path: str | os.PathLike) -> "RunConfig":
        """Load from YAML text or from a .yaml file path (empty or corrupt input raises one ValueError)."""
        return cls.from_dict(cls.read_yaml(text_or_path))
