"""Runs compared the way RL papers compare them (rliable's statistics, runner/results/stats.py).

    python -m runner.compare multirun/                      # compare/: page, figures, CSV
    python -m runner.compare outputs/ --by algo.name,compile.backend --out cmp

Every training run under the paths (a sweep's jobs, single runs, runs the Python API
made, or a results.uri copy) is a seed of its configuration on its env. Configurations
are told apart by the overrides that differ between runs, seed and env aside (or by the
config keys `--by` names). Per env: the learning curves of every configuration overlaid
(IQM over seeds with a 95 % bootstrap band), on env steps and on wall time, and each
configuration's final return. Across envs, on returns normalized by each env's random
policy (0) and its reference (1: the runs' check threshold, with its source): IQM,
median, mean and optimality gap with stratified bootstrap intervals, the run score
distribution (performance profile), and the probability of improvement of each
configuration over each other. Writes compare.md with its PNGs, compare.html (one file,
figures inside) and compare.csv (every figure).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runner.errors import RunnerError, tool_exit_code
from runner.results import plots, remote, seeds, stats
from runner.results.files import CONFIG, SUMMARY, read_overrides, write_csv
from runner.settings import overrides as ov

# Fewer seeds than this are marked, as docs/tuned.md marks them (rliable's advice).
SEEDS = 5
RANDOM_EPISODES = 100  # a random policy's return: the mean over this many episodes
# --x: a curve's axis, the metrics.jsonl field it reads, and its label.
AXES = {
    "env_steps": ("env_steps", "env steps sampled"),
    "seconds": ("wall_seconds", "wall-clock seconds"),
}
CSV_COLUMNS = (
    "section",
    "configuration",
    "versus",
    "env",
    "statistic",
    "value",
    "low",
    "high",
    "seeds",
)


@dataclass
class Run:
    """One training run: a seed of its configuration on its env."""

    dir: Path
    overrides: list[str]
    env: str
    final: float | None
    check: dict[str, Any] = field(default_factory=dict)
    configuration: str = ""


def find(paths: list[Path]) -> list[Run]:
    """Every training run under `paths` (its summary.json says task=train)."""
    runs = []
    for root in paths:
        for record in sorted(root.rglob(SUMMARY)):
            summary = json.loads(record.read_text())
            if summary.get("task") != "train":
                continue
            overrides = read_overrides(record.parent) or summary.get("overrides") or []
            env = " ".join(
                [
                    str(
                        (summary.get("choices") or {}).get("env")
                        or ov.value(overrides, "env")
                        or ""
                    ),
                    *(o for o in overrides if ov.key(o).startswith("env.")),
                ]
            ).strip()
            runs.append(
                Run(
                    record.parent,
                    overrides,
                    env or "default env",
                    summary.get("final_episode_return_mean"),
                    summary.get("check") or {},
                )
            )
    return runs


def _is_env(key: str) -> bool:
    return key == "env" or key.startswith("env.")


def label(runs: list[Run], by: list[str]) -> None:
    """Each run's configuration: the values of the `by` keys in its config.yaml, or the
    overrides (seed and env aside) that differ between the runs."""
    if by:
        from omegaconf import OmegaConf

        for run in runs:
            cfg = OmegaConf.load(run.dir / "config.yaml")
            run.configuration = " ".join(f"{k}={OmegaConf.select(cfg, k)}" for k in by)
        return
    own = [[o for o in r.overrides if ov.key(o) != "seed" and not _is_env(ov.key(o))] for r in runs]
    shared = set.intersection(*(set(o) for o in own)) if own else set()
    for run, mine in zip(runs, own, strict=True):
        run.configuration = " ".join(o for o in mine if o not in shared) or "(defaults)"


def references(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per env: the random policy's return (a check's measured baseline, else measured
    here) and the reference return (the runs' check threshold and its source, else the
    env's `solved_return`, the runner's default stop); envs with neither are left out of
    the normalized figures."""
    out: dict[str, dict[str, Any]] = {}
    for env in sorted({r.env for r in runs}):
        mine = [r for r in runs if r.env == env]
        checks = [r.check for r in mine if r.check.get("threshold") is not None]
        solved = _solved_return(mine[0])
        if not checks and solved is None:
            continue
        baselines = [c["baseline"]["return_mean"] for c in checks if c.get("baseline")]
        out[env] = {
            "random": float(np.mean(baselines)) if baselines else random_return(mine[0]),
            "random_from": "the check's baseline"
            if baselines
            else f"{RANDOM_EPISODES} random episodes",
            "reference": float(np.median([c["threshold"] for c in checks])) if checks else solved,
            "source": (checks[0].get("source") or "the check's threshold")
            if checks
            else f"env.solved_return (conf/env/{env.split()[0]}.yaml)",
        }
    return out


def _solved_return(run: Run) -> float | None:
    """The env's solved_return in the run's config.yaml (none: no such file or value)."""
    from omegaconf import OmegaConf

    path = run.dir / CONFIG
    value = OmegaConf.select(OmegaConf.load(path), "env.solved_return") if path.is_file() else None
    return None if value is None else float(value)


def random_return(run: Run) -> float:
    """A uniformly random policy's mean return on the run's env (its settings from the
    run's config.yaml), measured once and kept (runner/machine/measure_cache.py)."""
    import gymnasium
    from omegaconf import OmegaConf

    from runner.envs import from_settings, random_returns
    from runner.machine.measure_cache import cache_dir, cache_file, measured_or_cached
    from runner.settings.schema import EnvConfig

    saved = OmegaConf.load(run.dir / CONFIG).env
    env: EnvConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvConfig), saved))  # type: ignore[assignment]  # a structured node's object
    key = {"env": asdict(env), "episodes": RANDOM_EPISODES, "gymnasium": gymnasium.__version__}
    path = cache_file(cache_dir(None, "random-returns"), "random", key)

    def measure() -> float:
        made = from_settings(env)
        try:
            return float(np.mean(random_returns(made, 0, RANDOM_EPISODES)))
        finally:
            made.close()

    value, _ = measured_or_cached(path, key, False, measure, "XDG_CACHE_HOME")
    return float(value)


def by_configuration(runs: list[Run]) -> dict[str, dict[str, list[Run]]]:
    """configuration -> env -> its runs, in the order first met."""
    out: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        out.setdefault(run.configuration, {}).setdefault(run.env, []).append(run)
    return out


def score_matrix(envs: dict[str, list[Run]], refs: dict[str, dict[str, Any]]) -> np.ndarray:
    """Seeds x envs of normalized final returns, over the envs with a reference; as many
    seeds as the env with fewest has (rliable's matrices are whole)."""
    columns = []
    for env, ref in refs.items():
        finals = [r.final for r in envs.get(env, []) if r.final is not None]
        columns.append(stats.normalized(finals, ref["random"], ref["reference"]))
    seeds_each = min((len(c) for c in columns), default=0)
    return np.stack([c[:seeds_each] for c in columns], axis=1) if seeds_each else np.empty((0, 0))


def normalized_scores(
    groups: dict[str, dict[str, list[Run]]], refs: dict[str, dict[str, Any]]
) -> dict[str, np.ndarray]:
    """Each configuration's seeds x envs matrix of normalized finals, over the envs with a
    reference (configurations with none left out): the page's figures and its profile."""
    matrices = {name: score_matrix(envs, refs) for name, envs in groups.items()} if refs else {}
    return {name: m for name, m in matrices.items() if m.size}


def figures(
    groups: dict[str, dict[str, list[Run]]],
    refs: dict[str, dict[str, Any]],
    matrices: dict[str, np.ndarray],
    reps: int,
) -> list[dict[str, Any]]:
    """Every figure of the page as a CSV row: per env final returns, the aggregates over
    envs and the probability of improvement of each configuration over each other."""
    rows: list[dict[str, Any]] = []
    for name, envs in groups.items():
        for env, runs in envs.items():
            finals = np.asarray([[r.final] for r in runs if r.final is not None], dtype=float)
            if finals.size:
                point, low, high = stats.interval(finals, stats.iqm, reps)
                rows.append(
                    _row("final return", name, "", env, "iqm", point, low, high, len(finals))
                )
    for name, scores in matrices.items():  # across envs, then each env on its own
        columns = {"all": scores} | {e: score_matrix(groups[name], {e: refs[e]}) for e in refs}
        for env, matrix in columns.items():
            for statistic, func in stats.AGGREGATES.items():
                if matrix.size:
                    point, low, high = stats.interval(matrix, func, reps)
                    n = len(matrix)
                    rows.append(_row("normalized", name, "", env, statistic, point, low, high, n))
    for x in matrices:
        for y in matrices:
            if x != y:
                pair = (matrices[x], matrices[y])
                point, low, high = stats.interval(pair, stats.probability_of_improvement, reps)
                seeds_xy = min(len(matrices[x]), len(matrices[y]))
                rows.append(
                    _row("improvement", x, y, "all", "P(X > Y)", point, low, high, seeds_xy)
                )
    return rows


def _row(
    section: str,
    name: str,
    versus: str,
    env: str,
    statistic: str,
    value: float,
    low: float,
    high: float,
    n: int,
) -> dict[str, Any]:
    keys = CSV_COLUMNS
    return dict(
        zip(keys, (section, name, versus, env, statistic, value, low, high, n), strict=True)
    )


def draw(
    groups: dict[str, dict[str, list[Run]]],
    matrices: dict[str, np.ndarray],
    out: Path,
    reps: int,
    axes: list[str],
) -> list[Path]:
    """Per env and axis the configurations' curves overlaid; the performance profile."""
    drawn = []
    envs = sorted({env for envs in groups.values() for env in envs})
    for n, env in enumerate(envs):
        for axis in axes:
            field, xlabel = AXES[axis]
            series = {}
            for name, by_env in groups.items():
                curves = [seeds.curve(r.dir, field) for r in by_env.get(env, [])]
                if any(x.size for x, _ in curves):
                    series[f"{name} ({seeds.center(len(curves))})"] = seeds.band(curves)
            if series:
                path = out / f"curves_{n}_{axis}.png"
                drawn.append(plots.curves_band(path, series, xlabel, "episode return mean", env))
    if matrices:
        every = np.concatenate([m.ravel() for m in matrices.values()])
        taus = np.linspace(min(0.0, every.min()), max(1.0, every.max()), 50)
        series = {}
        for name, scores in matrices.items():
            fraction, low, high = stats.profile(scores, list(taus), reps)
            series[name] = (taus, fraction, low, high)
        xlabel = "normalized score (0: random policy, 1: reference) τ"
        drawn.append(
            plots.curves_band(
                out / "profile.png",
                series,
                xlabel,
                "fraction of runs with score > τ",
                "performance profile",
            )
        )
    return drawn


Block = tuple[str, Any]  # ("h", text), ("p", text), ("table", (header, rows)), ("img", path)


def _cell(rows: list[dict[str, Any]], **match: str) -> str:
    """A figure with its interval, e.g. "412 [380, 450]"; "-" where there is none; a
    figure over fewer than SEEDS seeds marked."""
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    if not found:
        return "-"
    r = found[0]
    digits = 0 if abs(r["value"]) >= 100 else 2
    few = f" ({r['seeds']} seeds)" if r["seeds"] < SEEDS else ""
    return f"{r['value']:,.{digits}f} [{r['low']:,.{digits}f}, {r['high']:,.{digits}f}]{few}"


def _table(rows: list[dict[str, Any]], names: list[str], columns: list[str], **fixed: str) -> Block:
    """Configurations down, `columns` across, each cell a figure of `rows`: the column's
    value is matched on the one key left out of `fixed` (env, or statistic)."""
    key = "env" if "statistic" in fixed else "statistic"
    cells = [
        [n, *(_cell(rows, configuration=n, **fixed, **{key: c}) for c in columns)] for n in names
    ]
    return ("table", (["configuration", *columns], cells))


def blocks(
    command: str,
    groups: dict[str, dict[str, list[Run]]],
    refs: dict[str, dict[str, Any]],
    rows: list[dict[str, Any]],
    drawn: list[Path],
) -> list[Block]:
    """The page, once, for both its Markdown and its HTML."""
    names = list(groups)
    envs = sorted({env for by_env in groups.values() for env in by_env})
    runs = sum(len(r) for by_env in groups.values() for r in by_env.values())
    head = (
        f"`{command}`: {runs} runs, {len(names)} configurations, {len(envs)} envs. Statistics "
        f"as rliable defines them (docs/compare.md); a figure over fewer than {SEEDS} seeds "
        "says how many."
    )
    out: list[Block] = [
        ("h1", "Comparison"),
        ("p", head),
        ("h2", "Final return per env (IQM over seeds, 95 % bootstrap interval)"),
        _table(rows, names, envs, section="final return", statistic="iqm"),
        ("h2", "Learning curves (IQM over seeds, 95 % bootstrap band)"),
        *(("img", p) for p in drawn if p.name.startswith("curves_")),
    ]
    if not refs:
        none = "No env has a reference return (a check threshold): no normalized figures."
        return [*out, ("p", none)]
    references = [
        [e, f"{r['random']:.1f}", r["random_from"], f"{r['reference']:g}", r["source"]]
        for e, r in refs.items()
    ]
    improvements = [
        [
            r["configuration"],
            r["versus"],
            _cell(rows, **{k: r[k] for k in ("section", "configuration", "versus")}),
        ]
        for r in rows
        if r["section"] == "improvement"
    ]
    return [
        *out,
        ("h2", "Across envs: returns normalized by a random policy (0) and a reference (1)"),
        ("table", (["env", "random return", "from", "reference", "source"], references)),
        ("p", "Each env's normalized score (IQM over seeds; every aggregate in compare.csv):"),
        _table(rows, names, list(refs), section="normalized", statistic="iqm"),
        ("p", "Across envs:"),
        _table(rows, names, list(stats.AGGREGATES), section="normalized", env="all"),
        *(("img", p) for p in drawn if p.name == "profile.png"),
        ("h2", "Probability of improvement: P(X > Y), ties a half, averaged over envs"),
        ("table", (["X", "Y", "P(X > Y)"], improvements)),
    ]


def markdown(page: list[Block]) -> str:
    lines = []
    for kind, content in page:
        if kind in ("h1", "h2"):
            lines += [f"{'#' * int(kind[1])} {content}", ""]
        elif kind == "p":
            lines += [content, ""]
        elif kind == "img":
            lines += [f"![{content.stem}]({content.name})", ""]
        else:
            header, body = content
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(map(str, row)) + " |" for row in body] + [""]
    return "\n".join(lines)


def html_page(page: list[Block]) -> str:
    """The same page as one HTML file, each figure inside it."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>Comparison</title>",
        "<style>body{font-family:sans-serif;max-width:60em}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ddd}</style>",
    ]
    for kind, content in page:
        if kind in ("h1", "h2", "p"):
            parts.append(f"<{kind}>{html.escape(content)}</{kind}>")
        elif kind == "img":
            data = base64.b64encode(content.read_bytes()).decode()
            parts.append(
                f"<img alt='{html.escape(content.stem)}' src='data:image/png;base64,{data}'>"
            )
        else:
            header, body = content
            head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
            cells = "".join(
                "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                for row in body
            )
            parts.append(f"<table><tr>{head}</tr>{cells}</table>")
    return "\n".join(parts) + "\n"


def build(
    paths: list[Path],
    out: Path,
    by: list[str],
    command: str,
    reps: int = stats.REPS,
    axes: list[str] | None = None,
) -> Path:
    """The comparison of every training run under `paths`, written into `out`."""
    runs = find(paths)
    if not runs:
        where = ", ".join(map(str, paths))
        raise RunnerError(
            f"compare: no training run (a summary.json with task=train) under {where}: give "
            "a sweep dir or run dirs (python -m runner -m ... writes them under multirun/)"
        )
    label(runs, by)
    groups, refs = by_configuration(runs), references(runs)
    out.mkdir(parents=True, exist_ok=True)
    matrices = normalized_scores(groups, refs)
    rows = figures(groups, refs, matrices, reps)
    write_csv(out / "compare.csv", rows, CSV_COLUMNS)
    drawn = draw(groups, matrices, out, reps, axes or list(AXES))
    page = blocks(command, groups, refs, rows, drawn)
    (out / "compare.md").write_text(markdown(page))
    (out / "compare.html").write_text(html_page(page))
    return out / "compare.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.compare",
        description="Compare the training runs under PATHs: curves, aggregates with "
        "intervals, performance profiles, probability of improvement.",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        help="sweep dirs, run dirs, or dirs holding them; local or a results.uri",
    )
    parser.add_argument(
        "--by",
        default="",
        help="config keys that name a configuration, e.g. algo.name,compile.backend "
        "(default: the overrides that differ)",
    )
    parser.add_argument(
        "--x",
        choices=list(AXES),
        help="the learning curves' axis (default: both, env steps and wall-clock seconds)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where the page goes (default: PATH/compare for one PATH, else outputs/compare)",
    )
    args = parser.parse_args(argv)
    out = args.out or (
        Path(args.paths[0]) / "compare"
        if len(args.paths) == 1 and not remote.is_uri(args.paths[0])
        else Path("outputs/compare")
    )
    command = " ".join(
        [
            "python -m runner.compare",
            *args.paths,
            *(["--by", args.by] if args.by else []),
            *(["--x", args.x] if args.x else []),
        ]
    )

    def work() -> int:
        paths = [
            remote.Pulled(p, "compare").local if remote.is_uri(p) else Path(p) for p in args.paths
        ]
        by = [k for k in args.by.split(",") if k]
        page = build(paths, out, by, command, axes=[args.x] if args.x else None)
        print(f"comparison: {page} (and compare.html, compare.csv)")
        return 0

    return tool_exit_code(work)


if __name__ == "__main__":
    sys.exit(main())
