"""The pipeline definition, built offline and checked as the JSON SageMaker receives.

Building a definition costs the SDK a second or more (make_session spares it re-checking its config
schema at every lookup), so one cached build of config/local.yaml serves every test.
"""
from __future__ import annotations

import copy
import functools
import json
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from sagemaker.core.common_utils import resolve_value_from_config
from sagemaker.core.config.config_schema import TELEMETRY_OPT_OUT_PATH

from pipeline.config import find_placeholders, load
from pipeline.definition import OfflineViolation, main, offline_boto_session
from pipeline.expressions import Environment, ExpressionError, evaluate, parameter_values
from pipeline.pipeline import make_session
from steps.config import ConfigError, apply_overrides, config_from_dict, load_yaml, to_dict
from steps.config.parameters import HYPERPARAMETERS

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "config" / "local.yaml"
EXAMPLE = ROOT / "config" / "config.yaml.example"
VALIDATED = "Steps.ValidateData.ProcessingOutputConfig.Outputs['validated'].S3Output.S3Uri"
MODEL = "Steps.TrainDAPO.ModelArtifacts.S3ModelArtifacts"
EVALUATION = "Steps.EvaluateModel.ProcessingOutputConfig.Outputs['evaluation'].S3Output.S3Uri"
REPORT = "Steps.EvaluateModel.PropertyFiles.EvaluationReport"


def local_build() -> dict[str, Any]:
    """`python -m pipeline.definition` on config/local.yaml, and every connection it attempted.

    Built once for the whole test run (building costs the SDK seconds); tests/test_iam.py reads it too. Each caller
    gets a copy of its own: a test that edits the definition (tests/test_reevaluate.py takes an input out) once
    changed it for every test after it in that worker.
    """
    return copy.deepcopy(_local_build())


@functools.cache
def _local_build() -> dict[str, Any]:
    connects: list[Any] = []
    real_connect = socket.socket.connect

    def record(sock: socket.socket, address: Any) -> Any:
        connects.append(address)
        return real_connect(sock, address)

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", record)
        out = Path(tmp) / "build" / "pipeline.json"  # the CLI creates missing directories
        code = main(["--config", str(LOCAL), "--out", str(out)])
        definition = json.loads(out.read_text())
    cfg, run = load(LOCAL)
    return {"code": code, "definition": definition, "connects": connects, "cfg": cfg, "run": run}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return local_build()


@pytest.fixture(scope="module")
def definition(built: dict[str, Any]) -> dict[str, Any]:
    return built["definition"]


def all_steps(definition: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for step in definition["Steps"]:
        yield step
        if step["Type"] == "Condition":
            yield from step["Arguments"]["IfSteps"]
            yield from step["Arguments"]["ElseSteps"]


def step(definition: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in all_steps(definition) if s["Name"] == name)


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def gets(node: Any) -> set[str]:
    return {d["Get"] for d in walk(node) if isinstance(d.get("Get"), str)}


def join_of(value: Any) -> list[Any]:
    assert "Std:Join" in value, value
    return value["Std:Join"]["Values"]


def inputs(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["InputName"]: i["S3Input"] for i in s["Arguments"]["ProcessingInputs"]}


# -- offline -----------------------------------------------------------------------------


def test_cli_writes_the_definition_without_opening_a_connection(built):
    assert built["code"] == 0
    assert built["definition"]["Version"] == "2020-12-01"
    assert built["connects"] == []


def test_the_offline_session_refuses_any_request():
    sts = offline_boto_session("us-west-2").client("sts")
    with pytest.raises(OfflineViolation, match="must not call AWS"):
        sts.get_caller_identity()


def test_the_sdk_sees_telemetry_opted_out():
    """The SDK's telemetry asks STS from a background thread and swallows the refusal; it must not even try."""
    session = make_session("us-west-2", "bucket", offline_boto_session("us-west-2"))
    opted_out = resolve_value_from_config(None, TELEMETRY_OPT_OUT_PATH, default_value=False, sagemaker_session=session)
    assert opted_out is True


def test_the_sdk_still_validates_its_config_at_each_lookup_against_its_schema_checked_once():
    """make_session swaps the SDK's per-lookup ``jsonschema.validate`` (which re-checks the SDK's constant schema
    against the meta-schema every time) for the same validation with the schema checked once."""
    from jsonschema.exceptions import ValidationError
    from sagemaker.core.config.config_manager import SageMakerConfig

    from pipeline.pipeline import SAGEMAKER_CONFIG

    make_session("us-west-2", "bucket", offline_boto_session("us-west-2"))
    assert getattr(SageMakerConfig.validate_sagemaker_config, "schema_checked_once", False)
    SageMakerConfig().validate_sagemaker_config(SAGEMAKER_CONFIG)
    with pytest.raises(ValidationError, match="'Bogus' was unexpected"):
        SageMakerConfig().validate_sagemaker_config({**SAGEMAKER_CONFIG, "Bogus": 1})
    with pytest.raises(ValidationError):
        SageMakerConfig().validate_sagemaker_config({"SchemaVersion": "2.0"})


def test_cli_reports_a_bad_config_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(LOCAL.read_text() + "  colour: blue\n")  # lands in the pipeline: section
    assert main(["--config", str(bad), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'pipeline.colour'" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


# -- structure ---------------------------------------------------------------------------


def test_steps_and_types(definition):
    assert [(s["Name"], s["Type"]) for s in definition["Steps"]] == [
        ("ValidateData", "Processing"),
        ("TrainDAPO", "Training"),
        ("EvaluateModel", "Processing"),
        ("CheckAccuracy", "Condition"),
    ]
    check = step(definition, "CheckAccuracy")["Arguments"]
    assert [(s["Name"], s["Type"]) for s in check["IfSteps"]] == [("ApproveModel", "Processing")]
    assert [(s["Name"], s["Type"]) for s in check["ElseSteps"]] == [("RecordRejection", "Processing"),
                                                                     ("AccuracyTooLow", "Fail")]


def test_every_reference_resolves(definition):
    params = {p["Name"] for p in definition["Parameters"]}
    steps = {s["Name"]: s for s in all_steps(definition)}
    for ref in gets(definition):
        kind, _, rest = ref.partition(".")
        if kind == "Parameters":
            assert rest in params, ref
        elif kind == "Execution":
            assert rest in ("PipelineExecutionId", "PipelineExecutionArn", "PipelineName"), ref
        else:
            assert kind == "Steps", ref
            name, _, path = rest.partition(".")
            assert name in steps, ref
            m = re.match(r"ProcessingOutputConfig\.Outputs\['(\w+)'\]", path)
            if m:  # the named output exists on that step
                outputs = steps[name]["Arguments"]["ProcessingOutputConfig"]["Outputs"]
                assert m[1] in {o["OutputName"] for o in outputs}, ref
            m = re.match(r"PropertyFiles\.(\w+)$", path)
            if m:  # the property file exists and reads one of the step's outputs
                files = {f["PropertyFileName"]: f for f in steps[name]["PropertyFiles"]}
                outputs = {o["OutputName"] for o in steps[name]["Arguments"]["ProcessingOutputConfig"]["Outputs"]}
                assert files[m[1]]["OutputName"] in outputs, ref


def test_the_dag_follows_the_data(definition):
    """Each step reads the previous step's properties, so no depends_on is needed."""
    upstream = {
        s["Name"]: {r.split(".")[1] for r in gets(s) if r.startswith("Steps.")} for s in all_steps(definition)
    }
    assert upstream["ValidateData"] == set()
    assert upstream["TrainDAPO"] == {"ValidateData"}
    assert upstream["EvaluateModel"] == {"ValidateData", "TrainDAPO"}
    assert upstream["CheckAccuracy"] >= {"EvaluateModel"}
    assert upstream["ApproveModel"] == upstream["RecordRejection"] == {"TrainDAPO", "EvaluateModel"}
    # The one ordering no data carries: the rejection is on the package before the execution fails.
    assert {s["Name"]: s["DependsOn"] for s in all_steps(definition) if "DependsOn" in s} == {
        "AccuracyTooLow": ["RecordRejection"]}


def test_validate_step_contract(definition):
    args = step(definition, "ValidateData")["Arguments"]
    app = args["AppSpecification"]
    assert app["ContainerEntrypoint"] == ["python", "-m", "steps.validate"]
    assert app["ImageUri"] == {"Get": "Parameters.ImageUri"}
    container_args = app["ContainerArguments"]
    assert container_args[:4] == ["--train", "/opt/ml/processing/input/train",
                                  "--eval", "/opt/ml/processing/input/eval"]
    assert container_args[4] == "--batch-size" and gets(container_args[5]) == {"Parameters.BatchSize"}
    assert container_args[6:8] == ["--output", "/opt/ml/processing/output/validated"]
    # The prompt-length check: the base model (its tokenizer and context from the Hub), the completion
    # budget and the chat-template arguments of the config, as TrainDAPO will render the prompts.
    assert container_args[8:16] == ["--base-model", {"Get": "Parameters.BaseModel"}, "--max-tokens", "512",
                                    "--chat-template-kwargs", "{}", "--region", "us-west-2"]
    # The rows' task: the Task parameter (the config's other task settings only when set).
    # The rows a split may lose (the MaxDroppedShare parameter), then the rows' task.
    assert container_args[16] == "--max-dropped-share" and gets(container_args[17]) == {"Parameters.MaxDroppedShare"}
    assert container_args[18:] == ["--task", {"Get": "Parameters.Task"}]
    ins = inputs(step(definition, "ValidateData"))
    assert set(ins) == {"train", "eval"}  # no tokenizer input unless pipeline.tokenizer_s3_uri is set
    assert ins["train"]["S3Uri"] == {"Get": "Parameters.TrainDataS3Uri"}
    assert ins["train"]["LocalPath"] == "/opt/ml/processing/input/train"
    assert ins["eval"]["S3Uri"] == {"Get": "Parameters.EvalDataS3Uri"}
    [out] = args["ProcessingOutputConfig"]["Outputs"]
    assert out["OutputName"] == "validated"
    assert out["S3Output"]["LocalPath"] == "/opt/ml/processing/output/validated"
    assert join_of(out["S3Output"]["S3Uri"]) == [
        "s3://dapo-local/pipeline", {"Get": "Execution.PipelineExecutionId"}, "ValidateData", "validated"
    ]
    assert args["ProcessingResources"]["ClusterConfig"]["InstanceType"] == {"Get": "Parameters.ProcessingInstanceType"}
    assert "ProcessingJobName" not in args


def test_train_step_contract(definition, built):
    args = step(definition, "TrainDAPO")["Arguments"]
    spec = args["AlgorithmSpecification"]
    assert spec["TrainingImage"] == {"Get": "Parameters.ImageUri"}
    # No SDK driver: the image's own entrypoint runs `train`.
    assert "ContainerEntrypoint" not in spec and "ContainerArguments" not in spec
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in args["InputDataConfig"]}
    assert set(channels) == {"train", "eval"}  # no code or sm_drivers channel
    assert join_of(channels["train"]) == [{"Get": VALIDATED}, "train.jsonl"]
    assert join_of(channels["eval"]) == [{"Get": VALIDATED}, "eval.jsonl"]
    assert args["ResourceConfig"]["InstanceType"] == {"Get": "Parameters.TrainingInstanceType"}
    assert args["StoppingCondition"]["MaxRuntimeInSeconds"] == built["cfg"].max_runtime_seconds
    assert args["RoleArn"] == built["cfg"].role_arn


def test_checkpoints_survive_a_retry(definition):
    """Same URI on every attempt of one execution (no step property in it), distinct per execution."""
    ckpt = step(definition, "TrainDAPO")["Arguments"]["CheckpointConfig"]
    assert ckpt["LocalPath"] == "/opt/ml/checkpoints"
    assert join_of(ckpt["S3Uri"]) == [
        "s3://dapo-local/pipeline", {"Get": "Execution.PipelineExecutionId"}, "TrainDAPO", "checkpoints"
    ]


def _no_step_properties(step: str, path: str) -> Any:
    raise ExpressionError(f"hyperparameters read no step property, but one reads Steps.{step}.{path}")


def test_hyperparameters_carry_the_whole_config(definition, built):
    hps = step(definition, "TrainDAPO")["Arguments"]["HyperParameters"]
    for key in ("batch_size", "group_size", "max_steps", "learning_rate", "max_num_gen_batches",
                "clip_low_threshold", "clip_high_threshold", "eval_size", "base_model",
                "role_arn", "model_package_group_arn", "s3_output_path", "region", "chat_template_kwargs",
                "max_context_tokens", "reward_format"):
        assert key in hps, key
    for name, key in HYPERPARAMETERS.items():
        assert gets(hps[key]) == {f"Parameters.{name}"}, key
    # What steps.train does with them: each parameter at its default, joined to a string (SageMaker's
    # job, done by the one interpreter), and the flat map applied onto an empty config.
    resolved = evaluate(hps, Environment(parameter_values(definition, {}), {}, step_property=_no_step_properties))
    run = config_from_dict(apply_overrides({}, resolved, "hyperparameters"), source="hyperparameters")
    assert to_dict(run) == to_dict(built["run"])


def test_evaluate_step_contract(definition):
    s = step(definition, "EvaluateModel")
    app = s["Arguments"]["AppSpecification"]
    # Under the supervisor that stops its training session if its process is killed (steps/supervise.py).
    assert app["ContainerEntrypoint"] == ["python", "-m", "steps.supervise", "--", "python", "-m", "steps.evaluate"]
    assert app["ContainerArguments"][:6] == [
        "--model", "/opt/ml/processing/input/model",
        "--eval", "/opt/ml/processing/input/eval",
        "--output", "/opt/ml/processing/output/evaluation",
    ]
    assert app["ContainerArguments"][6] == "--eval-size"
    assert gets(app["ContainerArguments"][7]) == {"Parameters.EvalSize"}
    ins = inputs(s)
    assert ins["model"] == {**ins["model"], "S3Uri": {"Get": MODEL}, "LocalPath": "/opt/ml/processing/input/model"}
    assert join_of(ins["eval"]["S3Uri"]) == [{"Get": VALIDATED}, "eval.jsonl"]
    assert s["PropertyFiles"] == [
        {"PropertyFileName": "EvaluationReport", "OutputName": "evaluation", "FilePath": "evaluation.json"}
    ]


def test_condition_and_branches(definition):
    """Approved only when every condition holds: accuracy at or above the threshold, at least one optimizer step (a
    run the cap stopped first evaluated the base weights), the paired improvement's 95% lower bound at or above
    MinImprovement, and no health guard's stop; otherwise the package records the rejection, then the execution
    fails."""
    check = step(definition, "CheckAccuracy")["Arguments"]

    def report(path):
        return {"Std:JsonGet": {"PropertyFile": {"Get": REPORT}, "Path": path}}

    accuracy, steps_completed = report("metrics.accuracy.value"), report("training.steps_completed")
    low, guard_stopped = report("improvement.ci95_low"), report("training.guard_stopped")
    assert check["Conditions"] == [
        {"Type": "GreaterThanOrEqualTo", "LeftValue": accuracy, "RightValue": {"Get": "Parameters.AccuracyThreshold"}},
        {"Type": "GreaterThanOrEqualTo", "LeftValue": steps_completed, "RightValue": 1},
        {"Type": "GreaterThanOrEqualTo", "LeftValue": low, "RightValue": {"Get": "Parameters.MinImprovement"}},
        {"Type": "Equals", "LeftValue": guard_stopped, "RightValue": 0},
    ]

    for name, extra in (("ApproveModel", []),
                        ("RecordRejection", ["--reject", "--output", "/opt/ml/processing/output/verdict"])):
        app = step(definition, name)["Arguments"]["AppSpecification"]
        assert app["ContainerEntrypoint"] == ["python", "-m", "steps.approve"]
        args = app["ContainerArguments"]
        assert args[:6] == ["--model", "/opt/ml/processing/input/model", "--evaluation",
                            "/opt/ml/processing/input/evaluation", "--execution-arn",
                            {"Get": "Execution.PipelineExecutionArn"}]
        assert args[6] == "--accuracy-threshold" and gets(args[7]) == {"Parameters.AccuracyThreshold"}
        assert args[8] == "--min-improvement" and gets(args[9]) == {"Parameters.MinImprovement"}
        assert args[10] == "--update-approval" and gets(args[11]) == {"Parameters.UpdateApproval"}
        assert args[12:] == extra
        ins = inputs(step(definition, name))
        assert ins["model"]["S3Uri"] == {"Get": MODEL}
        assert ins["evaluation"]["S3Uri"] == {"Get": EVALUATION}

    # AccuracyTooLow's message is RecordRejection's verdict in words (steps/approve.py), read from its verdict.json.
    rejection = step(definition, "RecordRejection")
    assert rejection["PropertyFiles"] == [{"PropertyFileName": "RejectionVerdict", "OutputName": "verdict",
                                           "FilePath": "verdict.json"}]
    [out] = rejection["Arguments"]["ProcessingOutputConfig"]["Outputs"]
    assert (out["OutputName"], out["S3Output"]["LocalPath"]) == ("verdict", "/opt/ml/processing/output/verdict")
    assert "ProcessingOutputConfig" not in step(definition, "ApproveModel")["Arguments"]
    assert join_of(step(definition, "AccuracyTooLow")["Arguments"]["ErrorMessage"]) == [
        {"Std:JsonGet": {"PropertyFile": {"Get": "Steps.RecordRejection.PropertyFiles.RejectionVerdict"},
                         "Path": "message"}}]


OWNER_ENVIRONMENT = {"DAPO_PIPELINE_NAME": {"Get": "Execution.PipelineName"},
                     "DAPO_PIPELINE_EXECUTION_ARN": {"Get": "Execution.PipelineExecutionArn"}}


def test_mlflow_is_off_unless_configured(definition):
    assert definition["MlflowConfig"] is None
    # What TrainDAPO always gets: whose job it is (its session's name, the orphan sweep).
    assert step(definition, "TrainDAPO")["Arguments"]["Environment"] == OWNER_ENVIRONMENT


def test_a_tracking_server_builds_the_mlflow_config_and_reaches_the_training_job(tmp_path):
    from pipeline.definition import build_definition

    server = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/dapo"
    raw = load_yaml(LOCAL)
    for experiment, expected in ((None, raw["pipeline"]["name"]), ("clip-sweep", "clip-sweep")):
        path = tmp_path / f"{expected}.yaml"
        path.write_text(json.dumps({**raw, "pipeline": {**raw["pipeline"], "mlflow_tracking_arn": server,
                                                        "mlflow_experiment": experiment}}))
        definition = build_definition(*load(path))
        assert definition["MlflowConfig"] == {"MlflowResourceArn": server, "MlflowExperimentName": expected}
        assert step(definition, "TrainDAPO")["Arguments"]["Environment"] == {
            "MLFLOW_TRACKING_URI": server, "MLFLOW_EXPERIMENT_NAME": expected, **OWNER_ENVIRONMENT}


def test_the_tokenizer_channel_and_the_chat_template_arguments_reach_every_step(tmp_path):
    """pipeline.tokenizer_s3_uri: TrainDAPO's `tokenizer` channel, ValidateData's and EvaluateModel's input and
    --tokenizer argument; session.chat_template_kwargs and max_context_tokens: ValidateData's arguments and the
    hyperparameters, read back as the same config (session.prices too)."""
    from pipeline.definition import build_definition

    raw = load_yaml(LOCAL)
    raw["pipeline"]["tokenizer_s3_uri"] = "s3://dapo-local/tokenizers/qwen3-6-27b"
    raw["session"].update(chat_template_kwargs={"enable_thinking": False, "note": "a long value " * 8},
                          max_context_tokens=32768, prices={"prefill_usd_per_million": 1.25,
                                                            "sample_usd_per_million": 5.5, "train_usd_per_million": 4})
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(raw))
    definition = build_definition(*load(path))
    uri, local = "s3://dapo-local/tokenizers/qwen3-6-27b/", "/opt/ml/processing/input/tokenizer"
    for name in ("ValidateData", "EvaluateModel"):
        assert inputs(step(definition, name))["tokenizer"] == {**inputs(step(definition, name))["tokenizer"],
                                                               "S3Uri": uri, "LocalPath": local}
        args = step(definition, name)["Arguments"]["AppSpecification"]["ContainerArguments"]
        assert args[args.index("--tokenizer") + 1] == local
    args = step(definition, "ValidateData")["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert json.loads(args[args.index("--chat-template-kwargs") + 1]) == raw["session"]["chat_template_kwargs"]
    assert args[args.index("--max-context-tokens") + 1] == "32768"
    train = step(definition, "TrainDAPO")["Arguments"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in train["InputDataConfig"]}
    assert channels["tokenizer"] == uri
    hps = train["HyperParameters"]
    run = config_from_dict(apply_overrides({}, {k: v for k, v in hps.items() if isinstance(v, str)}, "hp"), "hp")
    assert run.session.chat_template_kwargs == raw["session"]["chat_template_kwargs"]
    assert run.session.max_context_tokens == 32768
    assert run.session.prices.model_dump() == raw["session"]["prices"]  # the steps price their tokens with it


def test_parameters_and_their_defaults_come_from_the_config(definition, built):
    cfg, d, s = built["cfg"], built["run"].dapo, built["run"].session
    assert {p["Name"]: (p["Type"], p["DefaultValue"]) for p in definition["Parameters"]} == {
        "TrainDataS3Uri": ("String", cfg.train_s3_uri),
        "EvalDataS3Uri": ("String", cfg.eval_s3_uri),
        "BaseModel": ("String", s.base_model),
        "Task": ("String", "gsm8k"),
        "MaxDroppedShare": ("Float", 0.5),
        "BatchSize": ("Integer", 16),
        "GroupSize": ("Integer", 8),
        "MaxSteps": ("Integer", 30),
        "LearningRate": ("Float", 0.006),
        "MaxNumGenBatches": ("Integer", d.max_num_gen_batches),
        "SelectiveRollouts": ("Boolean", d.selective_rollouts),  # a switch: true or false
        "ClipLowThreshold": ("Float", d.clip_low_threshold),
        "ClipHighThreshold": ("Float", d.clip_high_threshold),
        "EvalSize": ("Integer", 100),
        "AccuracyThreshold": ("Float", cfg.accuracy_threshold),
        "MinImprovement": ("Float", 0.0),
        "UpdateApproval": ("Boolean", True),
        "ProcessingInstanceType": ("String", "ml.m5.large"),
        "TrainingInstanceType": ("String", "ml.m5.xlarge"),
        "ImageUri": ("String", "dapo-steps:local"),
    }


def test_job_steps_retry_capacity_and_throttling(definition):
    for name in ("ValidateData", "TrainDAPO", "EvaluateModel", "ApproveModel"):
        kinds = [e for p in step(definition, name)["RetryPolicies"] for e in p["ExceptionType"]]
        assert {"SageMaker.CAPACITY_ERROR", "SageMaker.RESOURCE_LIMIT", "SageMaker.JOB_INTERNAL_ERROR",
                "Step.THROTTLING", "Step.SERVICE_FAULT"} <= set(kinds), name
        for policy in step(definition, name)["RetryPolicies"]:
            assert 1 <= policy["MaxAttempts"] <= 20 and policy["IntervalSeconds"] >= 1


# -- metrics -----------------------------------------------------------------------------

LINES = {
    "sampling": "sampling: step=3 gen_batches=2 groups_sampled=64 filtered_frac=0.4531 kept_groups=35 empty_rollouts=0",
    "train": "train: step=3 reward_mean=0.4219 accuracy=0.4219 loss=-0.0123 tokens=12345 seconds=4.21 "
             "accuracy_lenient=0.5156 completion_tokens_mean=300.5 truncated_frac=0.0625 off_policy_steps=0 "
             "entropy=0.4120 sampler_kl=1.2e-05 completion_tokens_p50=210.0 completion_tokens_p95=880.0 "
             "completion_tokens_max=1024 repetition_frac=0.0312 format_error_rate=0.0469",
    "eval": "eval: step=10 accuracy=0.5300",
}
EXPECTED = {
    "train:reward_mean": 0.4219, "train:accuracy": 0.4219, "train:loss": -0.0123,
    "train:tokens": 12345, "train:seconds": 4.21, "train:accuracy_lenient": 0.5156,
    "train:entropy": 0.412, "train:sampler_kl": 1.2e-05, "train:completion_tokens_p50": 210.0,
    "train:completion_tokens_p95": 880.0, "train:completion_tokens_max": 1024, "train:truncated_frac": 0.0625,
    "train:repetition_frac": 0.0312, "train:format_error_rate": 0.0469,
    "sampling:gen_batches": 2, "sampling:groups_sampled": 64, "sampling:filtered_frac": 0.4531,
    "sampling:kept_groups": 35, "sampling:empty_rollouts": 0, "eval:accuracy": 0.53,
}


def metric_regexes(definition: dict[str, Any]) -> dict[str, str]:
    defs = step(definition, "TrainDAPO")["Arguments"]["AlgorithmSpecification"]["MetricDefinitions"]
    return {d["Name"]: d["Regex"] for d in defs}


def test_each_metric_reads_its_own_log_line(definition):
    regexes = metric_regexes(definition)
    assert set(regexes) == set(EXPECTED)
    for name, regex in regexes.items():
        own = name.split(":")[0]
        for kind, line in LINES.items():
            m = re.search(regex, line)
            if kind == own:
                assert m and float(m.group(1)) == pytest.approx(EXPECTED[name]), (name, line)
            else:
                assert m is None, (name, line)  # e.g. train:accuracy must not read the eval line


def test_metrics_read_signed_and_exponent_numbers(definition):
    regexes = metric_regexes(definition)
    line = "train: step=12 reward_mean=-1.5e-05 accuracy=1 loss=2.5E+3 tokens=7 seconds=.5 accuracy_lenient=1"
    got = {n: float(re.search(r, line).group(1)) for n, r in regexes.items() if n.startswith("train:")
           and re.search(r, line)}
    assert got == {"train:reward_mean": -1.5e-05, "train:accuracy": 1.0, "train:loss": 2500.0,
                   "train:tokens": 7.0, "train:seconds": 0.5, "train:accuracy_lenient": 1.0}
    # A health figure that could not be measured prints "nan": no datapoint, never a false 0.
    assert re.search(regexes["train:sampler_kl"], line + " entropy=0.5 sampler_kl=nan") is None


# -- config ------------------------------------------------------------------------------

REQUIRED = {
    "role_arn": "arn:aws:iam::123456789012:role/r",
    "image_uri": "img:1",
    "train_s3_uri": "s3://b/train",
    "eval_s3_uri": "s3://b/eval",
    "output_s3_uri": "s3://b/out",
}


@pytest.mark.parametrize("path", ["default.yaml", "local.yaml", "config.yaml.example"])
def test_shipped_configs_load(path):
    cfg, run = load(ROOT / "config" / path)
    assert cfg.output_s3_uri.startswith("s3://") and run.dapo.max_steps


def test_placeholders_are_found_in_the_example_only():
    assert "pipeline.image_uri" in find_placeholders(load(EXAMPLE)[1])
    assert find_placeholders(load(LOCAL)[1]) == []


def pipeline_config_from_dict(values, source):
    return config_from_dict({"pipeline": values}, source=source).pipeline


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "blue"}, "unknown key 'pipeline.colour'"),
        ({"role_arn": None}, "'pipeline.role_arn' must be of type str"),
        ({"role_arn": "my-role"}, "'pipeline.role_arn' must be an IAM role ARN"),
        ({"train_s3_uri": "/data/train"}, "'pipeline.train_s3_uri' must be an s3://"),
        ({"accuracy_threshold": 1.5}, "'pipeline.accuracy_threshold' must be in [0, 1]"),
        ({"max_runtime_seconds": 0}, "'pipeline.max_runtime_seconds' must be in [1,"),
        ({"name": "has_underscore"}, "'pipeline.name' must be letters"),
        ({"tags": ["a"]}, "'pipeline.tags' must be a mapping"),
        # config/iam/mlflow-policy.json grants tracking servers only: no MLflow app ARN gets past the config.
        ({"mlflow_tracking_arn": "arn:aws:sagemaker:us-west-2:123456789012:mlflow-app/app-abc"},
         "'pipeline.mlflow_tracking_arn' must be a SageMaker MLflow tracking server ARN"),
    ],
)
def test_bad_pipeline_settings_name_the_key(change, message):
    with pytest.raises(ConfigError) as err:
        pipeline_config_from_dict({**REQUIRED, **change}, source="my.yaml")
    assert str(err.value).startswith("my.yaml: ") and message in str(err.value)


def test_missing_required_setting_and_section(tmp_path):
    with pytest.raises(ConfigError, match="'pipeline.image_uri' is required"):
        pipeline_config_from_dict({k: v for k, v in REQUIRED.items() if k != "image_uri"}, source="my.yaml")
    no_pipeline = tmp_path / "no-pipeline.yaml"
    no_pipeline.write_text("dapo: {batch_size: 4}\n")
    with pytest.raises(ConfigError, match="a 'pipeline:' section is required"):
        load(no_pipeline)


def test_defaults_and_derived_values():
    cfg = pipeline_config_from_dict({**REQUIRED, "tags": {"team": "ml", "cost": 7}}, source="x")
    assert cfg.default_bucket == "b" and cfg.tags == {"team": "ml", "cost": "7"}
    assert (cfg.train_s3_uri, cfg.eval_s3_uri) == ("s3://b/train/", "s3://b/eval/")  # prefixes, not key stems
    assert cfg.processing_instance_type == "ml.m5.large" and cfg.training_instance_type == "ml.m5.xlarge"


def test_pipeline_needs_max_steps(tmp_path):
    raw = load_yaml(LOCAL)
    raw["dapo"] = {**raw["dapo"], "max_steps": None, "epochs": 1.0}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="'dapo.max_steps'"):
        load(path)
