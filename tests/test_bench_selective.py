"""make bench's selective-rollouts part (bench/selective.py): the toy's temporal-consistency diagnostic and how a
part measured alone keeps the other's figures. Pure functions: nothing is measured here."""
import pytest

from bench import selective
from steps.dapo.selective import ALL_RIGHT, ALL_WRONG, MIXED


def test_temporal_consistency_pairs_each_draw_of_a_prompt_with_its_previous_one():
    drawn = [  # (step, prompt, outcome)
        (1, 0, MIXED), (1, 1, ALL_WRONG), (1, 2, MIXED),
        (3, 0, ALL_RIGHT),  # mixed -> all right (learned), 2 steps later
        (4, 1, ALL_WRONG),  # all wrong -> all wrong, 3 steps later
        (4, 2, MIXED),  # mixed -> mixed, 3 steps later
        (6, 0, MIXED),  # all right -> mixed, 3 steps later
    ]
    c = selective.temporal_consistency(drawn)
    assert c["pairs"] == 4
    assert c["kept_character"] == pytest.approx(2 / 4)
    assert c["mixed_after_mixed"] == pytest.approx(1 / 2) and c["all_right_after_mixed"] == pytest.approx(1 / 2)
    assert c["mixed_after_all_equal"] == pytest.approx(1 / 2)
    assert c["steps_between_draws"] == pytest.approx((2 + 3 + 3 + 3) / 4)


def test_temporal_consistency_of_prompts_drawn_once_says_nothing():
    c = selective.temporal_consistency([(1, 0, MIXED), (1, 1, ALL_RIGHT)])
    assert c["pairs"] == 0
    assert c["kept_character"] is c["mixed_after_mixed"] is c["steps_between_draws"] is None


def test_a_part_measured_alone_keeps_the_other_parts_figures():
    stored = {"bench": {"runs": [], "date": "2026-12-05"}, "toy": {"runs": [], "date": "2026-12-05"},
              "seconds_toy": 675}  # a key of the old layout, not a part: dropped
    assert selective.measure(parts=(), previous=stored) == {"bench": stored["bench"], "toy": stored["toy"]}
