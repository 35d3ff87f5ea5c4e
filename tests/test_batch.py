import numpy as np
import pytest

from steps.dapo.batch import TrainSample, build_datum, build_datums, group_advantages, token_scales, train_samples
from steps.dapo.sampling import Group, Rollout
from steps.dapo.task import Grade


def test_group_advantages_centre_on_the_group_mean():
    assert group_advantages([1, 0, 0, 1]) == [0.5, -0.5, -0.5, 0.5]
    scaled = group_advantages([1, 0, 0, 0], std_scaling=True)
    assert np.isclose(np.std([1, 0, 0, 0]) * scaled[0], 0.75)
    assert group_advantages([1, 1, 1], std_scaling=True) == [0.0, 0.0, 0.0]


def test_overlong_samples_are_masked():
    group = Group(0, (1, 2), (Rollout((3, 4), (-1.0, -1.0), "length", 0.0, Grade(False, False, None)),
                              Rollout((5, 6), (-1.0, -1.0), "stop", 1.0, Grade(True, True, "7"))))
    masked, kept = train_samples([group], std_scaling=False, overlong_filtering=True)
    assert masked.weight == 0.0 and kept.weight == 1.0
    assert (masked.advantage, kept.advantage) == (-0.5, 0.5)
    assert all(s.weight == 1.0 for s in train_samples([group], std_scaling=False, overlong_filtering=False))


def test_datum_layout_shifts_by_one_and_masks_the_prompt():
    s = TrainSample(prompt=(10, 11, 12), completion=(20, 21, 22), sampling_logprobs=(-0.1, -0.2, -0.3), advantage=0.5)
    d = build_datum(s)
    assert d["modelInput"]["chunks"][0]["tokens"] == [10, 11, 12, 20, 21]
    li = d["lossFnInputs"]
    assert li["target_tokens"]["data"] == [11, 12, 20, 21, 22]
    assert li["weights"]["data"] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert li["advantages"]["data"] == [0.0, 0.0, 0.5, 0.5, 0.5]
    assert li["logprobs"]["data"] == [0.0, 0.0, -0.1, -0.2, -0.3]
    assert all(len(v["data"]) == 5 for v in li.values())


def test_datums_are_what_the_sdk_sends_for_the_same_typed_datums():
    """The raw dicts pass the SDK's own checks and equal its wire form of typed Datums."""
    from sagemaker.train.training_session import Datum, ModelInput, TensorData, TensorDtype
    from sagemaker.train.training_session._utils import batch_to_datum_list

    s = TrainSample(prompt=(10, 11, 12), completion=(20, 21), sampling_logprobs=(-0.1, -0.2), advantage=0.5)
    raw = build_datum(s)
    li = raw["lossFnInputs"]
    typed = Datum(model_input=ModelInput.from_ints(raw["modelInput"]["chunks"][0]["tokens"]), loss_fn_inputs={
        "target_tokens": TensorData(data=li["target_tokens"]["data"], dtype=TensorDtype.INT64),
        **{k: TensorData(data=li[k]["data"]) for k in ("weights", "advantages", "logprobs")},
    })
    assert batch_to_datum_list([raw], loss_fn_name="ppo") == batch_to_datum_list([typed], loss_fn_name="ppo")


def test_datum_rejects_missing_logprobs():
    with pytest.raises(ValueError, match="3 completion tokens but 0 sampling logprobs"):
        build_datum(TrainSample((1, 2), (3, 4, 5), (), 1.0))


def _per_token_weight(datums):
    """|advantage| per trained token, per datum: the weight each token gets in the summed loss."""
    return [[abs(a) for a, w in zip(d["lossFnInputs"]["advantages"]["data"], d["lossFnInputs"]["weights"]["data"])
             if w > 0] for d in datums]


def test_token_aggregation_weights_every_token_equally():
    short = TrainSample((1, 2), (3,) * 2, (-1.0,) * 2, 1.0)
    long = TrainSample((1, 2), (3,) * 8, (-1.0,) * 8, 1.0)
    weights = _per_token_weight(build_datums([short, long], "token"))
    flat = [w for ws in weights for w in ws]
    assert max(flat) == pytest.approx(min(flat)) == pytest.approx(1 / 10)  # one constant: 1 / trained tokens


def test_sequence_aggregation_weights_each_sample_equally():
    short = TrainSample((1, 2), (3,) * 2, (-1.0,) * 2, 1.0)
    long = TrainSample((1, 2), (3,) * 8, (-1.0,) * 8, 1.0)
    w_short, w_long = _per_token_weight(build_datums([short, long], "sequence"))
    assert sum(w_short) == pytest.approx(sum(w_long)) == pytest.approx(0.5)  # per-sample mean, averaged over 2
    assert w_short[0] == pytest.approx(4 * w_long[0])


def test_masked_samples_do_not_count_towards_the_token_total():
    kept = TrainSample((1,), (3,) * 4, (-1.0,) * 4, 1.0)
    masked = TrainSample((1,), (3,) * 6, (-1.0,) * 6, 1.0, weight=0.0)
    assert token_scales([kept, masked], "token") == [0.25, 0.25]
    with pytest.raises(ValueError, match="loss_aggregation"):
        token_scales([kept], "mean")
