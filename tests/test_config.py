import pytest
import yaml

from self_improve.config import ConfigError, load_params, parse_params

from .conftest import ROOT


def test_repo_params_load():
    p = load_params(ROOT / "params.yaml")
    assert list(p.loop) == ["it1", "it2", "it3"]
    assert p.judge.method == "co_reward"


def test_tiny_params_load(tiny_raw):
    assert parse_params(tiny_raw).prepare.model.hidden_size == 32


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda r: r["judge"].update(methd="x"), "judge.methd: unknown key"),
        (lambda r: r.update(sampel={}), "sampel: unknown key"),
        (lambda r: r["sample"].update(k="four"), "sample.k"),
        (lambda r: r["sample"].update(k=0), "sample.k"),
        (lambda r: r["sample"].update(temperature=-1), "sample.temperature"),
        (lambda r: r["judge"].update(method="oracle"), "judge.method"),
        (lambda r: r["train"].update(algorithm="ppo"), "train.algorithm"),
        (lambda r: r["prepare"]["model"].update(num_heads=3), "prepare.model"),
        (lambda r: r.pop("loop"), "loop: missing key"),
        (lambda r: r["loop"].update(it5={"prev": "it4", "ref": "it2"}), "loop.it5.prev"),
        (lambda r: r["loop"].update(it4={"prev": "it2", "ref": "it1"}), "loop.it4.prev"),
        (lambda r: r["loop"]["it1"].update(prev="base"), "loop.it1.prev"),
        (lambda r: r["train"].update(algorithm="grpo", grpo={"beta": -1}), "train.grpo.beta"),
        (lambda r: r["task"].update(max_operand=5), "task"),
    ],
)
def test_bad_params_refused_by_name(tiny_raw, mutate, needle):
    mutate(tiny_raw)
    with pytest.raises(ConfigError) as err:
        parse_params(tiny_raw)
    msg = str(err.value)
    assert needle in msg
    assert "\n" not in msg


def test_bad_yaml_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("seed: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(path)
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "nope.yaml")
    path.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_params(path)


def test_every_enum_value_survives_an_unquoted_yaml_rewrite():
    """dvc exp run -S rewrites params.yaml and drops quotes: a value YAML reads as a bool or null
    (off, on, yes, no, none...) would come back as another type and fail validation."""
    import enum

    import yaml

    from self_improve import config

    enums = [e for e in vars(config).values() if isinstance(e, type) and issubclass(e, enum.Enum) and e is not enum.Enum]
    assert enums
    for e in enums:
        for member in e:
            assert yaml.safe_load(f"k: {member.value}")["k"] == member.value, f"{e.__name__}.{member.name}"
