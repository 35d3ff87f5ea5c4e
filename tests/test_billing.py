"""What a run billed: the client's count, the session's count (DescribeTrainingSession against the local service),
the billing block the steps write, and the money at a price table. The steps' totals agreeing with the service's
count in a real run: tests/test_faults.py (TrainDAPO) and tests/test_evaluate_approve.py (EvaluateModel)."""
from __future__ import annotations

import logging

import pytest

from steps.config import ConfigError, config_from_dict
from steps.config.models import Prices
from steps.dapo.batch import TrainSample, build_datum
from steps.dapo.metrics import TRAIN_FIELDS, MetricsLog
from steps.platform import billing
from steps.platform.billing import TokenCount, TokenMeter

PRICES = Prices(prefill_usd_per_million=1.5, sample_usd_per_million=6.0, train_usd_per_million=3.0)


def test_money_is_each_kinds_tokens_at_its_price_per_million():
    assert billing.cost_usd(TokenCount(prefill=2_000_000, sample=500_000, train=1_000_000), PRICES) == \
        pytest.approx(2 * 1.5 + 0.5 * 6.0 + 1 * 3.0)
    assert billing.cost_usd(TokenCount(prefill=1), PRICES) == pytest.approx(1.5e-6)
    assert billing.cost_usd(TokenCount(1, 2, 3), None) is None  # no price table: tokens only


def test_the_client_counts_a_prompt_once_per_request_and_every_datum_token():
    meter = TokenMeter(start=TokenCount(10, 20, 30))  # an earlier attempt's, carried on
    meter.sampled(7, [[1, 2, 3], [4], []])  # one request of 3 samples: its 7-token prompt is prefilled once
    # A datum of a 7-token prompt and a 3-token completion: the model sees every token but the last.
    meter.trained([build_datum(TrainSample(tuple(range(7)), (7, 8, 9), (-0.1, -0.2, -0.3), 0.5))] * 2)
    assert meter.total == TokenCount(prefill=10 + 7, sample=20 + 4, train=30 + 2 * 9)
    assert meter.figures() == {"prefill_tokens": 17, "sample_tokens": 24, "train_tokens": 48}
    assert TokenMeter(meter.total, PRICES).figures()["cost_usd"] == pytest.approx((17 * 1.5 + 24 * 6 + 48 * 3) / 1e6)


def test_the_block_reports_the_services_count_with_the_clients_beside_it():
    client, service = TokenCount(100, 200, 300), TokenCount(100, 200, 300)
    assert billing.block(client, service, "s-1", None) == {
        "prefill_tokens": 100, "sample_tokens": 200, "train_tokens": 300, "source": billing.SERVICE,
        "session": "s-1", "client_count": {"prefill_tokens": 100, "sample_tokens": 200, "train_tokens": 300}}
    # The describe failed: the client's count stands, and says so.
    fallback = billing.block(client, None, "s-1", PRICES)
    assert (fallback["source"], fallback["prefill_tokens"]) == (billing.CLIENT, 100)
    assert fallback["cost_usd"] == pytest.approx((100 * 1.5 + 200 * 6 + 300 * 3) / 1e6)
    assert fallback["prices"] == PRICES.model_dump()
    # A resumed step: the earlier sessions' tokens (the client count starts from them) join this session's.
    earlier = TokenCount(40, 50, 60)
    resumed = billing.block(client, TokenCount(60, 150, 240), "s-2", None, earlier)
    assert TokenCount.from_fields(resumed) == client and resumed["earlier_sessions"] == earlier.fields()
    assert billing.line(resumed) == ("billing: prefill_tokens=100 sample_tokens=200 train_tokens=300 source=service "
                                     "session=s-2 client_prefill_tokens=100 client_sample_tokens=200 "
                                     "client_train_tokens=300")


def test_a_describe_that_fails_is_a_warning_not_an_error(local_service, caplog):
    """Against the local service, through boto3: a session it does not know (ResourceNotFound)."""
    with caplog.at_level(logging.WARNING, "steps.billing"):
        assert billing.service_count("no-such-session", "us-west-2") is None
    assert "billable tokens of training session no-such-session not read: DescribeTrainingSession failed" \
        in caplog.text


def test_the_train_line_appends_the_running_totals_and_the_step_ends_with_a_billing_record(tmp_path):
    lines: list[str] = []
    log = MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append)
    record = {k: 1 for k in TRAIN_FIELDS} | {"prefill_tokens": 5, "sample_tokens": 6, "train_tokens": 7,
                                             "cost_usd": 0.000123}
    log.step(record)
    assert lines[0].endswith(" prefill_tokens=5 sample_tokens=6 train_tokens=7 cost_usd=0.000123")
    assert lines[0].startswith("train: step=1 reward_mean=1 ")  # the existing fields first, as the regexes read them
    log.billing(3, billing.block(TokenCount(5, 6, 7), TokenCount(5, 6, 8), "s", None))
    assert lines[1].startswith("billing: prefill_tokens=5 sample_tokens=6 train_tokens=8 source=service session=s ")
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[1] == (
        '{"kind": "billing", "step": 3, "prefill_tokens": 5, "sample_tokens": 6, "train_tokens": 8, '
        '"client_prefill_tokens": 5, "client_sample_tokens": 6, "client_train_tokens": 7, '
        f'"source": "{billing.SERVICE}"}}')


def test_the_price_table_is_optional_and_checked_like_any_setting():
    assert config_from_dict({}).session.prices is None
    prices = {"prefill_usd_per_million": 0.5, "sample_usd_per_million": 2, "train_usd_per_million": 2.5}
    assert config_from_dict({"session": {"prices": prices}}).session.prices == Prices(**prices)
    with pytest.raises(ConfigError, match=r"'session.prices.train_usd_per_million' is required"):
        config_from_dict({"session": {"prices": {"prefill_usd_per_million": 1, "sample_usd_per_million": 1}}})
    with pytest.raises(ConfigError, match=r"'session.prices.sample_usd_per_million' must be \{prefill_usd_per_million"):
        config_from_dict({"session": {"prices": {**prices, "sample_usd_per_million": -1}}})
