"""neuron-monitor's configuration: the documented example resolves as documented; every mistake is
one ConfigError naming the key."""

from __future__ import annotations

import json

import pytest

from collectors.monitor_config import ConfigError, default_config, load_config, parse_config, parse_duration

DOC_EXAMPLE = {  # sys-tools.md §1.3
    "period": "2s",
    "neuron_runtimes": [
        {
            "tag_filter": "^train-",
            "period": "1s",
            "metrics": [
                {"type": "neuroncore_counters"},
                {"type": "execution_stats"},
                {"type": "memory_used", "period": "5s"},
            ],
        }
    ],
    "system_metrics": [
        {"type": "vcpu_usage"},
        {"type": "memory_info", "period": "10s"},
        {"type": "neuron_hw_counters"},
    ],
}


def test_documented_example_resolves_to_the_documented_periods():
    config = parse_config(DOC_EXAMPLE)
    (runtime,) = config.runtimes
    assert {g.type: g.period_s for g in runtime.groups} == {
        "neuroncore_counters": 1.0,
        "execution_stats": 1.0,
        "memory_used": 5.0,
    }
    assert {g.type: g.period_s for g in config.system} == {
        "vcpu_usage": 2.0,
        "memory_info": 10.0,
        "neuron_hw_counters": 2.0,
    }
    assert config.selector_for("train-llama") == 0
    assert config.selector_for("serve-bert") is None  # no entry: not collected at all


def test_defaults_every_group_every_application_every_5s():
    config = default_config()
    assert config.selector_for("anything") == 0
    assert {g.type for g in config.runtimes[0].groups} == {
        "neuroncore_counters",
        "execution_stats",
        "memory_used",
        "neuron_runtime_vcpu_usage",
    }
    assert all(g.period_s == 5.0 for g in (*config.runtimes[0].groups, *config.system))
    root_only = parse_config({"neuron_runtimes": [{"metrics": [{"type": "memory_used"}]}]})
    assert root_only.runtimes[0].groups[0].period_s == 5.0 and root_only.system == ()


def test_tag_filter_is_an_unanchored_search_and_the_first_match_wins():
    config = parse_config(
        {
            "neuron_runtimes": [
                {"tag_filter": "llama", "metrics": [{"type": "memory_used"}]},
                {"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}]},
            ]
        }
    )
    assert config.selector_for("ft-llama-7b") == 0
    assert config.selector_for("bert") == 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5s", 1.5), ("2h", 7200.0), ("250000us", 0.25)],
)
def test_go_durations(text, seconds):
    assert parse_duration(text, "period") == pytest.approx(seconds)


def test_legacy_group_names_map_with_a_warning():
    config = parse_config(
        {
            "neuron_runtimes": [
                {
                    "address": "unix:/run/neuron.sock",
                    "metrics": [
                        {"type": "inference_stats"},
                        {"type": "nc_counters"},
                        {"type": "runtime_cpu_usage"},
                    ],
                }
            ],
            "system_metrics": [{"type": "hw_counters"}],
        },
        "old.conf",
    )
    assert [g.type for g in config.runtimes[0].groups] == [
        "execution_stats",
        "neuroncore_counters",
        "neuron_runtime_vcpu_usage",
    ]
    assert config.system[0].type == "neuron_hw_counters"
    assert len(config.warnings) == 5 and all(w.startswith("old.conf: ") for w in config.warnings)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"perod": "1s"}, "perod: unknown key"),
        ({"period": "fast"}, "period: invalid duration 'fast'"),
        ({"period": 5}, "period: expected a duration string"),
        ({"period": "0s"}, "period: period '0s' is too short"),
        ({"neuron_runtimes": {}}, "neuron_runtimes: expected a list"),
        (
            {"neuron_runtimes": [{"tag_filter": "(unclosed"}]},
            "neuron_runtimes[0].tag_filter: invalid regular",
        ),
        (
            {"neuron_runtimes": [{"metrics": [{"type": "gpu_counters"}]}]},
            "neuron_runtimes[0].metrics[0].type: unknown metric group 'gpu_counters'",
        ),
        (
            {"neuron_runtimes": [{"metrics": [{"period": "1s"}]}]},
            "neuron_runtimes[0].metrics[0].type: missing",
        ),
        (
            {"neuron_runtimes": [{"metrics": [{"type": "memory_used", "period": "x"}]}]},
            "neuron_runtimes[0].metrics[0].period: invalid duration",
        ),
        ({"system_metrics": [{"type": "memory_used"}]}, "system_metrics[0].type: unknown metric group"),
        ({"system_metrics": [{"type": "vcpu_usage"}, {"type": "vcpu_usage"}]}, "listed twice"),
        (
            {"system_metrics": [{"type": "vcpu_usage", "colour": "red"}]},
            "system_metrics[0].colour: unknown key",
        ),
        ([], "must be a JSON object"),
    ],
)
def test_bad_configs_name_the_key(config, message):
    with pytest.raises(ConfigError) as info:
        parse_config(config, "m.conf")
    assert message in str(info.value) and str(info.value).startswith("m.conf")
    assert "\n" not in str(info.value)


def test_config_files(tmp_path):
    good = tmp_path / "good.conf"
    good.write_text(json.dumps(DOC_EXAMPLE))
    assert load_config(good).system[1].period_s == 10.0
    bad = tmp_path / "bad.conf"
    bad.write_text('{"period": "1s",\n  "system_metrics": [}')
    with pytest.raises(ConfigError, match=r"bad.conf: not valid JSON: .* line 2"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.conf")


# -- hostile configurations (issue 14): one line, never a crash or a hang --------------------------


@pytest.mark.parametrize(("config", "message"), [
    ({}, "selects no metric group"),
    ({"neuron_runtimes": [{"metrics": []}]}, "selects no metric group"),
    ({"period": "9" * 400 + "h"}, "is not a duration"),
    ({"period": "99999999999999h"}, "is too long"),
    ({"period": "25h", "system_metrics": [{"type": "vcpu_usage"}]}, "period: period '25h' is too long"),
    ({"neuron_runtimes": [{"tag_filter": "a" * 10_000_000}]}, "over the 1,024 limit"),
    ({"neuron_runtimes": [{"tag_filter": "(a+)+$"}]}, "repeats a repeat"),
    ({"neuron_runtimes": [{"tag_filter": "(a|aa)*$"}]}, "alternation"),
    ({"neuron_runtimes": [{"tag_filter": "(" * 5000 + ")" * 5000}]}, "over the 1,024 limit"),
    ({"neuron_runtimes": [{}] * 100_000}, "limit 256"),
    ({"period": [[[[["1s"]]]]]}, "expected a duration string"),
    ({"\ud800": 1}, "?: unknown key"),
], ids=["empty", "no-groups", "400-digit-period", "huge-period", "25h", "10MB-regex", "nested-repeat",
        "overlapping-alternation", "deep-regex", "many-entries", "nested-period", "surrogate"])
def test_hostile_configs_are_one_line(config, message):
    with pytest.raises(ConfigError) as info:
        parse_config(config, "m.conf")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_hostile_config_files(tmp_path):
    import os

    deep = tmp_path / "deep.conf"
    deep.write_text('{"period":' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(deep)
    digits = tmp_path / "digits.conf"
    digits.write_text('{"period": ' + "9" * 5000 + "}")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(digits)
    binary = tmp_path / "binary.conf"
    binary.write_bytes(b'{"period": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)
    big = tmp_path / "big.conf"
    big.write_text(" " * (2 << 20) + "{}")
    with pytest.raises(ConfigError, match="limit"):
        load_config(big)
    fifo = tmp_path / "fifo.conf"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(fifo)  # used to wait forever for a writer
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path)
