"""Say what it costs: the most generation batches a run may draw, the session time a step may take and the tokens
its sessions may bill (in USD with session.prices), printed by `make start-pipeline` (against moto here;
tests/test_local_run.py runs the local run, which prints the same)."""
from __future__ import annotations

import pytest

from pipeline import start as start_cmd
from pipeline.budget import PROMPT_TOKENS, describe, describe_toy, model_name, worst_case
from pipeline.throughput import Throughput
from steps.config import DapoConfig, load_config
from steps.config.models import Prices
from steps.platform.billing import TokenCount
from tests import test_pipeline_deploy as deploy_tests
from tests.test_pipeline_definition import ROOT
from tests.test_preflight import REGION

# test_pipeline_deploy's fixtures: a pipeline deployed in moto, and its config.
aws, account, config, pipeline_in_moto = (deploy_tests.aws, deploy_tests.account, deploy_tests.config,
                                          deploy_tests.pipeline_in_moto)


def test_the_most_a_run_may_draw_is_steps_x_gen_batches_x_batch_x_group():
    dapo = load_config(ROOT / "config" / "default.yaml").dapo  # 100 steps, 10 batches, 32 x 8
    budget = worst_case(dapo)
    assert (budget.gen_batches, budget.samples) == (100 * 10, 100 * 10 * 32 * 8)


def test_a_step_decodes_every_generation_batch_it_may_draw_at_the_cost_models_throughput():
    """Each added generation batch adds one batch's decoding: 256 sequences of 1024 tokens, more than the sampler's
    150 sequences at full speed, share its 6,000 tokens/s (the documented defaults)."""
    throughput = Throughput()
    assert (throughput.decode_tokens_per_s, throughput.capacity) == (6000.0, 150.0)
    one, two = (worst_case(DapoConfig(max_num_gen_batches=n, max_tokens=1024)).step_seconds for n in (10, 11))
    assert two - one == pytest.approx(256 * 1024 / 6000)
    # Few sequences decode at one token per 25 ms each, whatever the throughput.
    small = [worst_case(DapoConfig(batch_size=1, group_size=2, max_num_gen_batches=n, max_tokens=1024)).step_seconds
             for n in (1, 2)]
    assert small[1] - small[0] == pytest.approx(1024 * 0.025)


def test_the_message_names_the_settings_and_a_run_bounded_by_epochs():
    text = describe(DapoConfig(max_steps=30, max_num_gen_batches=4, batch_size=16, group_size=8, max_tokens=512))
    assert "a run may draw up to max_steps 30 x max_num_gen_batches 4 = 120 generation batches of 16 x 8 = 128 " \
           "samples (15,360 samples)" in text
    assert "estimate on AWS for the configured base model: a step may take up to " in text
    assert "30 steps: up to " in text
    epochs = describe(DapoConfig(max_steps=None, epochs=2))
    assert "each step may draw up to 10 generation batches" in epochs and "dapo.epochs bounds the steps" in epochs


def test_the_most_tokens_a_run_may_bill_and_their_price():
    """Every generation batch drawn, every completion max_tokens long: a step prefills each request's prompt once and
    trains every sample's prompt + completion - 1 tokens; the evaluations (3 in training at eval_every 10, then
    EvaluateModel's: both models, greedy and 4 samples a question) prefill and sample too."""
    p = PROMPT_TOKENS
    dapo = DapoConfig(max_steps=30, max_num_gen_batches=4, batch_size=16, group_size=8, max_tokens=512, eval_every=10,
                      eval_size=50, eval_k=4)
    budget = worst_case(dapo)
    requests = 4 * 16
    assert budget.step_tokens == TokenCount(prefill=requests * p, sample=requests * 8 * 512, train=16 * 8 * (p + 511))
    assert budget.eval_tokens == TokenCount(prefill=50 * (3 + 2 * 2) * p, sample=50 * (3 + 2 * 5) * 512)
    total = TokenCount(30 * requests * p, 30 * requests * 8 * 512, 30 * 16 * 8 * (p + 511)) + budget.eval_tokens
    assert budget.tokens == total
    text = describe(dapo)
    assert (f"cost: the run's sessions may bill up to {total.prefill:,} prefill, {total.sample:,} sample and "
            f"{total.train:,} train tokens, the evaluations' ") in text
    assert "set session.prices to see it in USD" in text
    prices = Prices(prefill_usd_per_million=1.5, sample_usd_per_million=6.0, train_usd_per_million=3.0)
    usd = (total.prefill * 1.5 + total.sample * 6.0 + total.train * 3.0) / 1e6
    assert f"{total.train:,} train tokens = USD {usd:,.2f}, the evaluations' " in describe(dapo, prices=prices)
    # Bounded by epochs: per step, and the evaluations' (the whole GSM8K test split at eval_size 0).
    epochs = describe(DapoConfig(max_steps=None, epochs=1, eval_size=0), prices=prices)
    assert "cost: each step may bill up to " in epochs and " sample tokens = USD " in epochs


def test_start_pipeline_says_what_it_may_cost_before_it_starts(pipeline_in_moto, config, capsys):
    session, sm, name = pipeline_in_moto
    start_cmd.start(session, name, REGION, {"MaxSteps": "30", "BatchSize": "64"}, str(config))
    out = capsys.readouterr().out
    dapo = load_config(config).dapo
    # The execution's values: the overrides in place, the rest from the config.
    assert (f"a run may draw up to max_steps 30 x max_num_gen_batches {dapo.max_num_gen_batches} = "
            f"{30 * dapo.max_num_gen_batches:,} generation batches of 64 x {dapo.group_size}") in out
    # The session time is an estimate, labelled with the model it is for (the config's base model).
    model = load_config(config).session.base_model.split("/")[-2]
    assert f"estimate on AWS for {model}: a step may take up to" in out
    assert "cost: the run's sessions may bill up to " in out


def test_the_toy_run_says_its_own_figures_and_no_aws_hours():
    """A 40-second toy run printed a ~30B model's hours as if they were its own: now only what the toy itself may
    draw and bill, labelled as the toy's, each line within 100 columns once the runner wraps it."""
    dapo = DapoConfig(max_steps=30, max_num_gen_batches=24, batch_size=16, group_size=8, max_tokens=512)
    text = describe_toy(dapo)
    b = worst_case(dapo)
    assert text.splitlines()[0].startswith("toy run: a run may draw up to max_steps 30 x max_num_gen_batches 24 ")
    assert f"toy run: its sessions may bill up to {b.tokens.prefill:,} prefill" in text and "no money" in text
    assert " h " not in text and " min " not in text and "30B" not in text and "estimate" not in text


def test_the_estimate_names_the_model_of_a_hub_arn():
    arn = "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/qwen3-32b/1.0.0"
    assert model_name(arn) == "qwen3-32b" and model_name("qwen3-32b") == "qwen3-32b"
    assert "estimate on AWS for qwen3-32b: " in describe(DapoConfig(max_steps=3), base_model=arn)


def test_start_refuses_a_batch_larger_than_a_train_file_it_can_count(pipeline_in_moto, config, capsys):
    """One small train object is counted before the execution starts; with several, the console says that
    ValidateData refuses it before any session starts."""
    from pipeline.aws import UserError
    from tests.test_preflight import BUCKET

    session, sm, name = pipeline_in_moto
    with pytest.raises(UserError, match=rf"BatchSize 5000 is larger than the train data: s3://{BUCKET}/data/train/"
                                        r"gsm8k-train\.jsonl has 100 rows; lower it"):
        start_cmd.start(session, name, REGION, {"BatchSize": "5000"}, str(config))
    assert sm.list_pipeline_executions(PipelineName=name)["PipelineExecutionSummaries"] == []
    s3 = session.client("s3")
    s3.put_object(Bucket=BUCKET, Key="data/train/more.jsonl", Body=b'{"question": "q", "answer": "#### 2"}\n')
    start_cmd.start(session, name, REGION, {"BatchSize": "5000"}, str(config))
    assert ("BatchSize 5000: the train rows under s3://" in capsys.readouterr().out and
            len(sm.list_pipeline_executions(PipelineName=name)["PipelineExecutionSummaries"]) == 1)
