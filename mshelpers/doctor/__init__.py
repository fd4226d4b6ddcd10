"""A config doctor: point it at a mindformers training file, get memory, step time, MFU and a better layout.

    python -m mshelpers.doctor CONFIG.yaml [--hardware NAME] [--devices N] [--budget 58GB] [--model-config
        config.json] [--log train.log|metrics.csv [--refit]] [--out DIR] [--format md|text|json] [--json]
    (the console script ms-doctor is the same; exit 0 fits, 1 does not fit, 2 refused)

It reads every dialect mindformers ships (r1.x legacy YAMLs, 1.x mcore static YAMLs with `use_legacy: False`
and a Hugging Face config.json, 2.x PyNative YAMLs), dense and MoE, GQA and MLA, and answers verdict first:
memory per pipeline stage against the budget, the step decomposed term by term, tokens/s per device, MFU in
three conventions against the SKU's datasheet peak, and the top 5 layouts under the budget. With --log it
reads your own run and prints the measured tokens/s/p, MFU and the prediction's error.

The rooms, each one concern (data flows readers -> cost <- hardware, topology; search and calibration use cost;
report and logs use all of them; the CLI uses report and logs):
  describe.py     Model, MoE, Layout (the package's one; its schedule too), Config, Calibration (and the fitted
                  CALIBRATION), DoctorError: the vocabulary
  layouts.py      the stage split, per-stage recompute and the layout checks the reader and the variants share
  keys.py         every key of a section the readers read: priced, known but not priced, or flagged (nearest key)
  readers.py      a file in any dialect -> one Model + one Layout (read_config, with_layout)
  variants.py     the same model on another layout (layout_variant: dataclasses.replace, no YAML), and the file
                  of a layout that is written out (edited_yaml)
  profiles.py     Ascend profiles, each figure with its source; "cpu" is this machine
  topology.py     ranks placed on nodes in mindformers' order per dialect; the span and links of each group
  cost.py         FLOPs, parameters, the step decomposed on the links each group crosses, memory per stage
                  (never sees a YAML; the one memory model: mshelpers.memory.estimate prices a RunConfig by it)
  adapt.py        for parallel.py: a RunConfig's Config built directly, a file's Layout on other degrees (replace),
                  and the prices in the planner's terms (bytes per group, stage activations)
  search.py       layouts under the budget, ranked; the smallest scale at which a config that cannot fit does
  published.py    mindformers' published tokens/s/p with the YAMLs they link
  calibration.py  the fit, the error by family, leave-one-family-out, rankings and Kendall's tau
  heldout.py      the runs kept apart (another Ascend stack, never fitted on), priced and summarised
  logs.py         a mindformers training log or metrics.csv -> measured steps
  diagnosis.py    the verdict, the tables, the pictures, the improved YAML
  yamledit.py     the improved YAML as the user's text with only the changed keys edited (comments, anchors kept)
  cpu_check.py    the cost model checked on this CPU against the mini LLaMA (notebook 12)
  cli.py          the command line
Copy the whole `doctor/` folder (with `memory_activations.py`, `memory_states.py` and `pipeline.py` beside it for
memory, `peak.py` for the cpu profile).

What the model leaves out: workspace and fragmentation in the memory pool (the reserve is HCCL's buffers only),
kernel efficiency that varies with shape beyond the expert GEMMs' roofline (small TP shards), MC2 where nothing
says it is on (Config.mc2: a 2.x file's parallelism.enable_mc2 or --mc2), fine_grain_interleave and micro_batch_interleave_num overlap, a trained router's imbalance
(chance is assumed; --moe-imbalance gives one), data loading, host launch overhead, contention. It ranks layouts and says how far off it was on published configs; measure.
"""
from __future__ import annotations

import os

from .calibration import (CALIBRATION, GUIDE_SOURCE, OFF_FAMILIES, Calibration, calibration_summary,
                          calibration_table, cites_two_sources, family_of, family_summary, fit_calibration, fixture_dir,
                          guide_13b_ranking, guide_13b_steps, kendall_tau, leave_one_family_out, lofo_summary,
                          moe_placement, off_families, ranking_groups, release_of, stand_in_points,
                          unexplained_families)
from .cli import main, measured_run
from .cost import (TERMS, flops_per_token, layer_ops, memory_per_stage, memory_reserve, mtp_params, param_count,
                   pattern_ops, stage_params, step_time, with_reserve)
from .cpu_check import (CPU_ALLREDUCE_SIZES, CPU_CHECK_SET, CPU_FIT_SET, cpu_check, cpu_hardware,
                        fit_cpu_calibration, measure_cpu_steps, mini_config, predict_cpu)
from .describe import EXPECTED_ERROR, FIT_FILES, Config, DoctorError, Layout, Model, MoE
from .heldout import heldout_runs, price as heldout_price, summarise as heldout_summary
from .profiles import HARDWARE, HARDWARE_NAMES, DoctorHardware, hardware
from .published import PUBLISHED
from .readers import ALIASES, dialect_of, load_yaml, parse_size, read_config, read_model, stage_split, with_layout
from .diagnosis import (diagnose, figures, load_with_mindformers, published_scatter, render_text, summary_json,
                     write_outputs)
from .search import as_shipped_limit, better_layouts, changed_keys, layout_answers, smallest_fitting_scale
from .topology import groups as rank_groups, rank_map, span as group_span
from .variants import edited_yaml, layout_variant

CPU_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_worker.py")   # msrun's script
