"""`stream-dapo ablate`: the DAPO paper's Table 1 ladder, run at this config's scale.

Every (preset, seed) cell is one `stream-dapo run` child with the same optimizer-step budget and the
same seeds; the table reports what was measured, including where the toy scale disagrees with the
paper's direction::

    stream-dapo ablate --seeds 3 --budget 40 --out runs/ablation
    stream-dapo ablate --presets naive-grpo,dapo --seeds 1 --set learner.lr=2e-4
    stream-dapo ablate --presets token-tis,geo-mask,icepop,gspo --dry-run

``--presets`` takes either family of `stream_dapo.core.presets`: Table 1's rows (the default) or the
off-policy corrections (token-tis, geo-mask, icepop, gspo; bench/studies/offpolicy.py runs them on
the long-CoT recipe with a staleness bound that binds). Table 1's rows are compared with the paper
and with naive-grpo; other presets with the first one selected. ``--dry-run`` prints every cell's
command and whether a finished cell is there already, and runs nothing.

What a cell is:

- the preset's five switches are passed as explicit ``--set`` overrides next to ``algo.preset``: a
  preset only fills keys nobody set, and a recipe file such as tiny-cpu.toml sets all five, so
  ``algo.preset`` alone would leave most rows running the file's DAPO switches;
- ``generator.seed`` and ``learner.seed`` are the cell's seed. ``data.seed`` is not: it also draws
  the synthetic task and its eval split, and every preset and seed must train on the same problems
  and be evaluated on the same eval set (the prompt order therefore is the same for every seed);
- equal budget means equal ``learner.total_steps`` (optimizer steps); dynamic sampling generates
  more samples per step, so samples generated are reported next to accuracy.

The config files and ``--set`` overrides are resolved once per call into ``OUT/base-config.toml``,
which every child reads: editing a recipe file while an ablation runs does not change its cells.
The warm model is evaluated once (``OUT/eval-before``); each cell runs without the launcher's
evaluation and its final policy is evaluated after training (``OUT/PRESET/seed-N/eval_after.json``).
A cell whose record (``ablation_cell.json``, written last) matches the resolved config and the
model is skipped, so an interrupted ablation continues where it stopped; ``--max-cells N`` trains at
most N cells in one call and leaves the rest to the same command run again. ``--report-only`` trains
and evaluates nothing: it writes the table and plots of the cells already done (a partial ladder
stopped between sessions) and names the missing ones. Each record names the machine its cell trained
on (`stream_dapo.runtime.host.describe_machine`) and the code its run started with (`code_version`: the
commit, read as the cell starts, since the ablate process itself keeps the code it imported); a report
whose cells trained on several machines says that their seconds compare only within one, and one
whose cells ran several versions of the code names them.

Outputs: ``OUT/ablation.md`` (the table, each step against the paper's, what a step costs in
generated samples and how many steps and seconds the training reward takes to reach a target, and
each seed's own figures, each curve's first and last quarter in numbers), ``OUT/ablation.json`` (every number) and
``OUT/plots/*.png`` (one per CURVE_METRICS key per optimizer step, mean over seeds; needs the
``bench`` extra's matplotlib).

The package: `settings` (metrics, fingerprint rules), `cells` (running and recording cells),
`stats` (spreads, curves, time to target, the rows), `render` (markdown and plots); the command is
`stream_dapo.cli.ablate`.
"""

from __future__ import annotations

from stream_dapo.tools.ablate.cells import (
    Plan,
    PlannedCell,
    build_report,
    cell_is_done,
    cell_overrides,
    config_fingerprint,
    done_cells,
    eval_fingerprint,
    evaluate_before,
    freeze_base_config,
    load_cell,
    model_key,
    planned_cells,
    read_curves,
    run_cell,
    run_child,
    write_report,
)
from stream_dapo.tools.ablate.render import direction, plot_curves, render_markdown, to_json
from stream_dapo.tools.ablate.settings import (
    CELL_RECORD,
    CURVE_METRICS,
    TARGET_METRIC,
    TARGET_WINDOW,
    describe_changes,
    preset_changes,
)
from stream_dapo.tools.ablate.stats import (
    SPARSE_CURVES,
    CellResult,
    CurvePoint,
    Spread,
    aggregate,
    curve_window_means,
    mean_curve,
    spread,
    time_to_target,
    training_start,
    window_means,
)

__all__ = [
    "CELL_RECORD",
    "CURVE_METRICS",
    "CellResult",
    "CurvePoint",
    "Plan",
    "PlannedCell",
    "SPARSE_CURVES",
    "Spread",
    "TARGET_METRIC",
    "TARGET_WINDOW",
    "aggregate",
    "build_report",
    "cell_is_done",
    "cell_overrides",
    "config_fingerprint",
    "curve_window_means",
    "describe_changes",
    "direction",
    "done_cells",
    "eval_fingerprint",
    "evaluate_before",
    "freeze_base_config",
    "load_cell",
    "mean_curve",
    "model_key",
    "planned_cells",
    "plot_curves",
    "preset_changes",
    "read_curves",
    "render_markdown",
    "run_cell",
    "run_child",
    "spread",
    "time_to_target",
    "to_json",
    "training_start",
    "window_means",
    "write_report",
]
