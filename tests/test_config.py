import pytest

from steps.config import ConfigError, apply_overrides, config_from_dict, load_config
from steps.config.models import DapoConfig


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_are_dapo():
    cfg = config_from_dict({})
    assert (cfg.dapo.clip_low_threshold, cfg.dapo.clip_high_threshold) == (0.8, 1.28)
    assert cfg.dapo.loss_fn == "ppo"


@pytest.mark.parametrize(
    "section,key,value,words",
    [
        ("dapo", "group_size", 1, "'dapo.group_size' must be >= 2"),
        ("dapo", "batch_size", 0, "'dapo.batch_size' must be >= 1"),
        ("dapo", "clip_low_threshold", 0.0, "'dapo.clip_low_threshold' must be in (0, 1]"),
        ("dapo", "clip_low_threshold", 1.2, "'dapo.clip_low_threshold' must be in (0, 1]"),
        ("dapo", "clip_high_threshold", 0.9, "'dapo.clip_high_threshold' must be in [1, 10]"),
        ("dapo", "max_tokens", 100, "'dapo.max_tokens' must be >= 512"),
        ("dapo", "loss_fn", "dpo", "'dapo.loss_fn' must be one of ppo, importance_sampling, cispo"),
        ("dapo", "learning_rate", "fast", "'dapo.learning_rate' must be of type"),
        ("dapo", "overlong_filtering", "yes please", "'dapo.overlong_filtering' must be of type"),
        ("dapo", "lr", 0.1, "unknown key 'dapo.lr'"),
        ("session", "lora_rank", 0, "'session.lora_rank' must be >= 1"),
        # SamplingParams.seed is a 32-bit signed Integer on the API; derived seeds stay in range for these.
        ("dapo", "seed", -1, "'dapo.seed' must be in [0, 2147483647]"),
        ("dapo", "seed", 2**31, "'dapo.seed' must be in [0, 2147483647]"),
    ],
)
def test_bad_values_name_file_and_key(tmp_path, section, key, value, words):
    import yaml

    path = write(tmp_path, yaml.safe_dump({section: {key: value}}))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(path) in str(exc.value)
    assert words in str(exc.value)


def test_unknown_section_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="unknown section 'trainer'"):
        load_config(write(tmp_path, "trainer: {}\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "dapo: [unclosed\n"))
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")


def test_cross_field_checks(tmp_path):
    with pytest.raises(ConfigError, match="set 'dapo.max_steps' or 'dapo.epochs'"):
        load_config(write(tmp_path, "dapo: {max_steps: null}\n"))
    with pytest.raises(ConfigError, match="overlong_buffer"):
        load_config(write(tmp_path, "dapo: {max_tokens: 512, overlong_buffer: 600}\n"))


def test_hyperparameter_overrides_are_routed_and_typed(tmp_path):
    path = write(tmp_path, "dapo: {batch_size: 8}\nsession: {region: us-west-2}\n")
    cfg = load_config(path, {"batch_size": "64", "learning_rate": "3e-5", "overlong_filtering": "false",
                             "role_arn": "arn:aws:iam::123456789012:role/x", "dapo.seed": "7",
                             "base_model": '"quoted-name"'})
    assert cfg.dapo.batch_size == 64 and cfg.dapo.learning_rate == 3e-5 and cfg.dapo.seed == 7
    assert cfg.dapo.overlong_filtering is False
    assert cfg.session.role_arn == "arn:aws:iam::123456789012:role/x"
    assert cfg.session.base_model == "quoted-name"
    assert cfg.session.region == "us-west-2"


def test_override_of_unknown_key_is_an_error():
    with pytest.raises(ConfigError, match="unknown setting 'batchsize'"):
        apply_overrides({}, {"batchsize": "3"}, "hp")
    with pytest.raises(ConfigError, match="unknown setting 'session.batch_size'"):
        apply_overrides({}, {"session.batch_size": "3"}, "hp")
    # An override is validated like the file: out of range names the key.
    with pytest.raises(ConfigError, match="'dapo.group_size' must be >= 2"):
        config_from_dict(apply_overrides({}, {"group_size": "1"}, "hp"), "hp")


def test_default_yaml_documents_every_key_with_the_models_default():
    """config/default.yaml is the reference: every key of every section, each at the model's default.

    Keys without a usable default (required, or None because only the site knows them) carry an
    example value there instead.
    """
    from pathlib import Path

    from steps.config import load_yaml
    from steps.config.models import SECTIONS

    raw = load_yaml(Path(__file__).resolve().parents[1] / "config" / "default.yaml")
    assert set(raw) == set(SECTIONS)
    for section, model in SECTIONS.items():
        assert set(raw[section]) == set(model.model_fields), section
        for name, field in model.model_fields.items():
            default = None if field.is_required() else field.get_default(call_default_factory=True)
            if default is not None:
                assert raw[section][name] == default, f"{section}.{name}"


def test_each_parameter_has_its_config_keys_type_a_switch_a_boolean():
    """The console types a parameter by its Type: an on/off key is a Boolean (true/false), never an Integer."""
    from typing import Literal, get_args, get_origin

    from steps.config.models import SECTIONS
    from steps.config.parameters import PARAMETERS

    def types(annotation: object) -> set:
        if get_origin(annotation) is Literal:
            return {type(value) for value in get_args(annotation)}
        if get_args(annotation):  # X | None
            return set().union(*(types(a) for a in get_args(annotation) if a is not type(None)))
        return {annotation}

    kinds = {bool: "Boolean", int: "Integer", float: "Float", str: "String"}
    for p in PARAMETERS:
        annotation = SECTIONS[p.section].model_fields[p.field].annotation
        assert {kinds[t] for t in types(annotation)} == {p.kind}, f"{p.name}: {p.kind} for {p.key}: {annotation}"


def test_the_documented_parameter_table_is_the_parameter_table():
    from pathlib import Path

    from steps.config.parameters import markdown_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert markdown_table() in page


@pytest.mark.parametrize("text, first", [
    ("dapo: {batch_sise: 8}\n", "unknown key 'dapo.batch_sise'; did you mean 'dapo.batch_size'?"),
    ("dpao: {batch_size: 8}\n", "unknown section 'dpao'; did you mean 'dapo'?"),
    ("dapo: {zzzzzz: 8}\n", "unknown key 'dapo.zzzzzz'"),
])
def test_a_typo_gets_did_you_mean_in_a_short_line_and_every_known_key_after_it(tmp_path, text, first):
    """The first line says what is wrong and the closest name; the full list follows, wrapped, never a
    680-character line."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    lines = str(exc.value).splitlines()
    assert lines[0] == f"{path}: {first}" and all(len(line) < 200 for line in lines)
    listed = " ".join(lines[1:])
    known = ["session", "dapo", "pipeline"] if first.startswith("unknown section") else list(DapoConfig.model_fields)
    assert all(f" {name}," in f" {listed}," for name in known), listed
    with pytest.raises(ConfigError, match=r"unknown setting 'dapo\.batch_sise'; did you mean 'dapo\.batch_size'\?"):
        apply_overrides({}, {"dapo.batch_sise": "3"}, "hp")


def test_an_error_names_the_parameters_only_when_some_were_given(tmp_path):
    """Not "config.yaml + parameters : ..." when no parameter was given (issue 29)."""
    from pipeline.start import check_params

    path = write(tmp_path, "dapo: {batch_size: 0}\n")
    with pytest.raises(ConfigError) as exc:
        check_params({}, {"MaxSteps": "Integer"}, str(path))
    assert str(exc.value).startswith(f"{path}: 'dapo.batch_size' must be >= 1")
    with pytest.raises(ConfigError) as exc:
        check_params({"MaxSteps": "3"}, {"MaxSteps": "Integer"}, str(path))
    assert str(exc.value).startswith(f"{path} + parameters MaxSteps=3: 'dapo.batch_size' must be >= 1")
