"""benchmarks/overhead.py's parts that need no training: the config comparison, the table
of fewer repeats, and the refusal of none (its run is the README's command, test_readme.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "overhead.py"
_spec = importlib.util.spec_from_file_location("overhead", PATH)
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)


def test_nested_dicts_flatten_to_dotted_keys_and_lists_stay_values():
    config = {"lr": 0.001, "_model_config": {"fcnet_hiddens": [64, 64], "head": {"act": "relu"}}}
    assert overhead.flatten({**config, "env_config": {}}) == {
        "lr": 0.001,
        "_model_config.fcnet_hiddens": [64, 64],
        "_model_config.head.act": "relu",
        "env_config": {},
    }


def test_a_model_size_difference_is_named_with_both_values():
    runner = {"lr": 0.001, "_model_config": {"fcnet_hiddens": [64, 64]}, "env_config": {}}
    plain = {"lr": 0.001, "_model_config": {"fcnet_hiddens": [256, 256]}, "extra": None}
    assert overhead.config_differences(runner, plain) == [
        ("_model_config.fcnet_hiddens", [64, 64], [256, 256]),
        ("env_config", {}, overhead.ABSENT),
        ("extra", overhead.ABSENT, None),
    ]
    assert overhead.config_differences(runner, runner) == []


def test_pair_ratios_and_ratio_of_medians():
    runner = [{"first_iteration_s": s, "env_steps_per_s": 100 * s} for s in (1, 2, 3, 4, 10)]
    plain = [{"first_iteration_s": s, "env_steps_per_s": 100 * s} for s in (2, 2, 2, 2, 2)]
    fig = overhead.summarize(runner, plain)["first_iteration_s"]
    assert fig["runner"] == {"min": 1, "median": 3, "max": 10}
    assert fig["ratio_of_medians"] == 1.5
    assert fig["pair_ratio"] == {"min": 0.5, "median": 1.5, "max": 5}


def test_fewer_than_five_repeats_show_medians_only(capsys):
    runner = [{"first_iteration_s": 2.0, "env_steps_per_s": 100.0}]
    plain = [{"first_iteration_s": 1.0, "env_steps_per_s": 200.0}]
    overhead.print_table(overhead.summarize(runner, plain), repeats=1)
    lines = capsys.readouterr().out.splitlines()
    first = next(line for line in lines if line.startswith("first iteration"))
    assert first.split()[-3:] == ["-", "2.00", "-"]
    assert lines[-1].startswith("(min and max left out: 1 repeat(s) say nothing of the spread")
    overhead.print_table(overhead.summarize(runner * 5, plain * 5), repeats=5)
    first = next(line for line in capsys.readouterr().out.splitlines() if "first" in line)
    assert first.split()[-3:] == ["2.00", "2.00", "2.00"]


@pytest.mark.parametrize("args", [["--repeats", "0"], ["--iterations", "0"]])
def test_no_repeat_or_iteration_is_refused_in_one_line(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        overhead.main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == "overhead.py: --repeats and --iterations take 1 or more\n"
