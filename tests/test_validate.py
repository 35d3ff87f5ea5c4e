"""The ValidateData step (python -m steps.validate) and the streaming reader behind it."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from steps import validate
from steps.cli import ENV_CALLER
from steps.tasks import Example, formats, load_examples, rules
from steps.tasks import reader as data
from steps.tasks.reader import DataError, data_files, iter_lines
from steps.tasks.rules import DigestSet
from steps.validate import main

REPO = Path(__file__).resolve().parents[1]


def row(question: str, answer: str = "3 + 4 = <<3+4=7>>7\n#### 7", **extra) -> dict:
    return {"question": question, "answer": answer, **extra}


def good_rows(n: int, who: str = "Ann") -> list[dict]:
    return [
        row(f"{who} has {i} apples and buys 4 more. How many apples does {who} have?",
            f"{i} + 4 = <<{i}+4={i + 4}>>{i + 4}\n#### {i + 4}")
        for i in range(n)
    ]


def write_jsonl(path: Path, lines: list) -> Path:
    """Each item is a row (dict, written as JSON) or a raw line (bytes, written as is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for item in lines:
            f.write(item if isinstance(item, bytes) else json.dumps(item).encode())
            f.write(b"\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run(train: Path, eval_: Path, out: Path, batch_size: int = 2, *extra: str) -> tuple[int, dict]:
    rc = main(["--train", str(train), "--eval", str(eval_), "--batch-size", str(batch_size), "--output", str(out),
               *extra])
    report = json.loads((out / "validation.json").read_text()) if (out / "validation.json").exists() else {}
    return rc, report


@pytest.fixture
def eval_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "eval.jsonl", good_rows(3, who="Zed"))


GOOD = good_rows(4)
LONG = json.dumps(row("x" * (data.MAX_LINE_BYTES + 10))).encode()

# One defect each, appended as line 5 after four good rows: (id, line, reason)
BAD_ROWS = [
    ("truncated-json", b'{"question": "Q?", "answer": "#### 1"', data.INVALID_JSON),
    ("trailing-garbage", b'{"question": "Q?", "answer": "#### 1"} x', data.INVALID_JSON),
    ("nan", b'{"question": "Q?", "answer": "#### 1", "score": NaN}', data.INVALID_JSON),
    ("latin-1", '{"question": "Caf\u00e9 sells 3 cakes?", "answer": "#### 3"}'.encode("latin-1"), data.NOT_UTF8),
    ("array", b"[1, 2]", data.NOT_OBJECT),
    ("string", b'"Q? #### 1"', data.NOT_OBJECT),
    ("missing-question", {"answer": "#### 1"}, data.MISSING_QUESTION),
    ("missing-answer", {"question": "Q?"}, data.MISSING_ANSWER),
    ("question-number", {"question": 5, "answer": "#### 1"}, data.QUESTION_NOT_STRING),
    ("question-null", {"question": None, "answer": "#### 1"}, data.QUESTION_NOT_STRING),
    ("answer-number", {"question": "Q?", "answer": 7}, data.ANSWER_NOT_STRING),
    ("answer-list", {"question": "Q?", "answer": ["#### 7"]}, data.ANSWER_NOT_STRING),
    ("empty-question", row(""), data.EMPTY_QUESTION),
    ("blank-question", row(" \t "), data.EMPTY_QUESTION),
    ("no-hashes", row("Q?", "3 + 4 = 7"), formats.NO_FINAL_ANSWER),
    ("hashes-no-number", row("Q?", "3 + 4 = 7\n####"), formats.NO_FINAL_ANSWER),
    ("word-number", row("Q?", "#### seven"), formats.NO_FINAL_ANSWER),
    ("empty-answer", row("Q?", ""), formats.NO_FINAL_ANSWER),
    ("duplicate", GOOD[1], rules.DUPLICATE_QUESTION),
    ("duplicate-case-space", row("  ANN has 1 apples and buys 4 more.  How many apples does Ann have?"),
     rules.DUPLICATE_QUESTION),
    ("line-too-long", LONG, data.LINE_TOO_LONG),
]


@pytest.mark.parametrize("bad, reason", [case[1:] for case in BAD_ROWS], ids=[case[0] for case in BAD_ROWS])
def test_each_defect_is_rejected_with_its_reason(tmp_path, eval_file, bad, reason):
    train = write_jsonl(tmp_path / "train.jsonl", [*GOOD, bad, row("Last row still read?")])
    rc, report = run(train, eval_file, tmp_path / "out")
    assert rc == 0
    split = report["splits"]["train"]
    assert split["rejected_by_reason"] == {reason: 1}
    assert split["first_rejected"][0] | {"detail": ""} == {"file": str(train), "line": 5, "reason": reason,
                                                           "detail": ""}
    assert (split["rows"], split["kept"]) == (6, 5)
    assert read_jsonl(tmp_path / "out" / "train.jsonl") == [*GOOD, row("Last row still read?")]


def test_good_dataset_is_accepted_and_cleaned(tmp_path, capsys):
    rows = [row("Ünïcode question: 3 + 4?", id=1, source="gsm8k"), *good_rows(3)]
    train = tmp_path / "train.jsonl"
    write_jsonl(train, rows[:2] + [b"", b"  "] + rows[2:])  # blank lines are skipped, not rejected
    train.write_bytes(b"\xef\xbb\xbf" + train.read_bytes())  # a UTF-8 BOM is tolerated
    eval_ = write_jsonl(tmp_path / "eval.jsonl", good_rows(2, who="Zed"))
    out = tmp_path / "out"

    rc, report = run(train, eval_, out, 4)

    assert rc == 0
    assert sorted(os.listdir(out)) == ["eval.jsonl", "train.jsonl", "validation.json"]  # no temp files
    assert read_jsonl(out / "train.jsonl") == rows  # extra fields kept, order kept
    assert read_jsonl(out / "eval.jsonl") == good_rows(2, who="Zed")
    assert report["status"] == "accepted"
    assert report["batch_size"] == 4
    assert report["kept"] == {"train": 4, "eval": 2}
    assert report["overlap"]["count"] == 0
    assert report["splits"]["train"]["rows"] == 4 and report["splits"]["train"]["rejected"] == 0
    assert report["splits"]["train"]["inputs"] == [
        {"file": str(train), "sha256": hashlib.sha256(train.read_bytes()).hexdigest(), "bytes": train.stat().st_size}
    ]
    assert report["outputs"] == {"train": "train.jsonl", "eval": "eval.jsonl"}
    assert "train 4/4 rows kept" in capsys.readouterr().out
    assert load_examples(out / "train.jsonl")[0] == Example(question="Ünïcode question: 3 + 4?", gold="7")


def test_overlap_with_eval_is_removed_from_train_by_default(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [*GOOD, row("What is 6 times 7?", "#### 42")])
    eval_ = write_jsonl(tmp_path / "eval.jsonl", [row("what is  6 TIMES 7?", "#### 42"), row("Other?", "#### 1")])
    rc, report = run(train, eval_, tmp_path / "out")
    assert rc == 0
    assert report["overlap"] == {"count": 1, "action": "removed", "first_rows": [{"file": str(train), "line": 5}]}
    assert report["kept"] == {"train": 4, "eval": 2}
    assert report["splits"]["train"]["rejected"] == 0  # an overlap is not a defect of the row
    assert read_jsonl(tmp_path / "out" / "train.jsonl") == GOOD


def test_overlap_is_refused_with_on_overlap_fail(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [*GOOD, row("What is 6 times 7?", "#### 42")])
    eval_ = write_jsonl(tmp_path / "eval.jsonl", [row("what is  6 TIMES 7?", "#### 42")])
    out = tmp_path / "out"
    rc, report = run(train, eval_, out, 2, "--on-overlap", "fail")
    assert rc == 2
    assert report["status"] == "refused"
    assert report["overlap"]["count"] == 1 and report["overlap"]["action"] == "refused"
    err = capsys.readouterr().err
    assert f"{train}:5" in err and "--on-overlap remove" in err
    assert sorted(os.listdir(out)) == ["validation.json"]


def test_directory_input_reads_every_jsonl_file_in_order(tmp_path, eval_file):
    d = tmp_path / "train"
    a = write_jsonl(d / "a.jsonl", good_rows(2))
    b = write_jsonl(d / "sub" / "b.jsonl", [row("Bo has 1 pen. How many pens?", "#### 1"), good_rows(1)[0]])
    (d / "notes.txt").write_text("not data")
    rc, report = run(d, eval_file, tmp_path / "out")
    assert rc == 0
    split = report["splits"]["train"]
    assert [i["file"] for i in split["inputs"]] == [str(a), str(b)]
    assert split["first_rejected"][0] == {
        "file": str(b), "line": 2, "reason": rules.DUPLICATE_QUESTION,
        "detail": "an earlier row asks it, ignoring case and spacing"
    }
    assert read_jsonl(tmp_path / "out" / "train.jsonl") == [*good_rows(2),
                                                             row("Bo has 1 pen. How many pens?", "#### 1")]


def test_too_few_train_rows_is_refused_and_leaves_no_cleaned_file(tmp_path, eval_file, capsys):
    out = tmp_path / "out"
    train = write_jsonl(tmp_path / "train.jsonl", good_rows(10))
    assert run(train, eval_file, out, 8)[0] == 0  # an earlier accepted run in the same directory
    write_jsonl(train, [*good_rows(3), b"{oops", {"question": "Q?"}])

    rc, report = run(train, eval_file, out, 8)

    assert rc == 2
    assert sorted(os.listdir(out)) == ["validation.json"]  # stale and temp files gone
    err = capsys.readouterr().err
    for part in (str(train), "3 usable rows", "--batch-size 8", "5 rows read", "2 rejected",
                 f"{train}:4: invalid JSON", f"{train}:5: missing answer", "fix:", "at most 3"):
        assert part in err
    assert "Traceback" not in err
    assert report["status"] == "refused"
    assert report["kept"]["train"] == 3
    assert report["splits"]["train"]["rejected_by_reason"] == {data.INVALID_JSON: 1, data.MISSING_ANSWER: 1}
    assert report["outputs"] == {}


@pytest.mark.parametrize("eval_lines", [[], [b"", b"{}"], [row("Q?", "#### x")]],
                         ids=["empty-file", "only-bad", "no-answer"])
def test_eval_without_usable_rows_is_refused(tmp_path, eval_lines, capsys):
    eval_ = write_jsonl(tmp_path / "eval.jsonl", eval_lines)
    rc, report = run(write_jsonl(tmp_path / "train.jsonl", GOOD), eval_, tmp_path / "out")
    assert rc == 2
    assert report["kept"]["eval"] == 0
    assert "eval data has no usable rows" in capsys.readouterr().err
    assert not (tmp_path / "out" / "eval.jsonl").exists()


def test_missing_inputs_are_refused_naming_every_path(tmp_path, capsys):
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    rc, report = run(tmp_path / "nope.jsonl", empty_dir, tmp_path / "out")
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--train {tmp_path / 'nope.jsonl'}: no such file" in err
    assert f"--eval {empty_dir}: no data file among no file; the formats read: JSONL (.jsonl), JSON" in err
    assert report["status"] == "refused" and report["splits"] == {}


def test_bad_arguments_exit_2(tmp_path, eval_file, capsys):
    assert main(["--train", str(eval_file), "--eval", str(eval_file), "--batch-size", "0",
                 "--output", str(tmp_path)]) == 2
    assert "--batch-size: must be >= 1" in capsys.readouterr().err


def test_a_crash_exits_1_with_a_short_message_and_no_partial_output(tmp_path, eval_file, monkeypatch, capsys):
    def explode(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(validate, "refusal_problems", explode)
    rc, report = run(write_jsonl(tmp_path / "train.jsonl", GOOD), eval_file, tmp_path / "out")
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: RuntimeError: disk on fire; running the step again starts it over"
    assert os.listdir(tmp_path / "out") == []


def test_cli_exit_code_and_message(tmp_path, eval_file):
    train = write_jsonl(tmp_path / "train.jsonl", good_rows(1))
    proc = subprocess.run(
        [sys.executable, "-m", "steps.validate", "--train", str(train), "--eval", str(eval_file), "--batch-size", "4",
         "--output", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, ENV_CALLER: "make"},
    )
    assert proc.returncode == 2, proc.stderr
    # From make (make local-run's ValidateData), the setting is named as the user typed it, not as the step's option.
    assert 'train data has 1 usable rows, fewer than the batch size (PARAMS="BatchSize=4")' in proc.stderr
    assert '(PARAMS="BatchSize=1")' in proc.stderr and "--batch-size" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_load_examples_names_file_and_line_of_a_bad_row(tmp_path):
    f = write_jsonl(tmp_path / "clean.jsonl", [*GOOD, {"question": "Q?", "answer": "no number"}])
    with pytest.raises(ValueError, match=rf"clean.jsonl:5: {formats.NO_FINAL_ANSWER}"):
        load_examples(f)
    assert load_examples(write_jsonl(f, GOOD[:2])) == [Example(GOOD[0]["question"], "4"),
                                                       Example(GOOD[1]["question"], "5")]


def test_jsonl_files_and_iter_lines(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        data_files(tmp_path / "missing")
    f = write_jsonl(tmp_path / "x.jsonl", [b"", GOOD[0], b"   ", b"[]"])
    assert [(line.line_no, line.error) for line in iter_lines(f)] == [(2, None), (4, data.NOT_OBJECT)]


def test_digest_set_membership_across_merges(monkeypatch):
    monkeypatch.setattr(DigestSet, "MERGE_AT", 4)
    s = DigestSet()
    added = [7, 2**64 - 1, 0, 123456789, 2**63, 42, 5, 99, 1000, 3]
    for d in added:
        s.add(d)
    assert len(s) == len(added)
    assert all(d in s for d in added)
    assert not any(d in s for d in (1, 2**64 - 2, 2**63 + 1, 6))


def _peak_bytes(tmp_path: Path, rows: int, eval_: Path) -> tuple[int, int]:
    train = tmp_path / f"train{rows}.jsonl"
    with open(train, "w") as f:
        for i in range(rows):
            question = f"Ann has {i} apples and buys 4 more. How many apples does she have?"
            f.write(json.dumps(row(question, f"{i} + 4 = {i + 4}\n#### {i + 4}")) + "\n")
    tracemalloc.start()
    try:
        report = validate.validate(str(train), str(eval_), 8, tmp_path / f"out{rows}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report["status"] == "accepted" and report["kept"]["train"] == rows
    return peak, train.stat().st_size


@pytest.mark.slow
def test_memory_stays_flat_in_file_size(tmp_path, eval_file):
    small_peak, small_size = _peak_bytes(tmp_path, 20_000, eval_file)
    big_peak, big_size = _peak_bytes(tmp_path, 200_000, eval_file)
    assert big_size > 25_000_000
    assert big_peak < 16_000_000
    # What remains per row is its 8-byte question digest (briefly twice while
    # merging), against ~140 bytes of file per row.
    assert (big_peak - small_peak) / 180_000 < 32, (small_peak, big_peak)


# -- prompts too long for the model ---------------------------------------------------------------
# The base model's tokenizer and context come from its Hub record: the local service's for the toy
# (HuggingfaceId: the toy's tokenizer files; RecipeCollection SequenceLength "1K" = 1024 tokens).


def toy_prompt_tokens(question: str) -> int:
    from local.training_session.toy.tokenizer import ToyTokenizer
    from steps.gsm8k.prompt import render_prompt

    return len(render_prompt(ToyTokenizer(), question))


def model_args(*extra: str) -> list[str]:
    from tests.local_service import BASE_MODEL_ARN

    return ["--base-model", BASE_MODEL_ARN, *extra]


@pytest.mark.usefixtures("local_service")
def test_prompts_that_fit_the_hubs_context_are_kept(tmp_path, eval_file):
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    rc, report = run(train, eval_file, tmp_path / "out", 2, *model_args("--max-tokens", "512"))
    assert rc == 0 and report["kept"] == {"eval": 3, "train": 4}
    assert report["prompt_budget"]["max_tokens"] == 512 and report["prompt_budget"]["context_tokens"] == 1024
    assert "local-toy-arith" in report["prompt_budget"]["source"]


@pytest.mark.usefixtures("local_service")
def test_a_question_whose_prompt_and_max_tokens_exceed_the_context_is_rejected_naming_row_and_limit(
        tmp_path, eval_file, capsys):
    long = row("Ann has 3 apples and buys 4 more. " * 3 + "How many apples does Ann have?")
    train = write_jsonl(tmp_path / "train.jsonl", [*GOOD, long])
    n = toy_prompt_tokens(long["question"])
    limit = str(512 + n - 1)  # one token short for the long question, room for the short ones
    rc, report = run(train, eval_file, tmp_path / "out", 2, *model_args("--max-tokens", "512",
                                                                         "--max-context-tokens", limit))
    assert rc == 0 and report["kept"]["train"] == 4
    [rejected] = report["splits"]["train"]["first_rejected"]
    assert rejected["line"] == 5 and rejected["reason"] == data.PROMPT_TOO_LONG
    assert rejected["detail"] == (f"{n} prompt tokens + max_tokens 512 = {n + 512} > {limit}, the context of "
                                  "session.max_context_tokens")
    assert "prompt too long for the model 1" in capsys.readouterr().out


@pytest.mark.usefixtures("local_service")
def test_a_setting_larger_than_the_hubs_context_cannot_raise_it(tmp_path, eval_file, capsys):
    """The toy's Hub record says 1,024 tokens: a max_context_tokens of 4,096 still checks against 1,024."""
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    rc, report = run(train, eval_file, tmp_path / "out", 2, *model_args("--max-tokens", "1000",
                                                                         "--max-context-tokens", "4096"))
    assert rc == 2 and report["status"] == "refused"
    assert "exceeds the model's context 1024" in capsys.readouterr().out


@pytest.mark.usefixtures("local_service")
def test_max_tokens_no_prompt_fits_is_refused(tmp_path, eval_file, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    rc, report = run(train, eval_file, tmp_path / "out", 2, *model_args("--max-tokens", "1000"))
    assert rc == 2 and report["status"] == "refused"
    err = capsys.readouterr().err
    assert "eval data has no usable rows" in err and f"{eval_file}:1: prompt too long for the model (" in err
    assert "+ max_tokens 1000 = " in err and "> 1024, the context of arn:aws:sagemaker:" in err


def test_with_a_tokenizer_directory_no_hub_is_asked(tmp_path, eval_file, monkeypatch, capsys):
    """A job without network: the files of pipeline.tokenizer_s3_uri, the context from the setting."""
    from local.training_session.toy.tokenizer import HF_FILES
    from tests.local_service import ENDPOINT_ENV_VARS

    for var in ENDPOINT_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    rc, report = run(train, eval_file, tmp_path / "a", 2, *model_args("--tokenizer", str(HF_FILES),
                                                                       "--max-tokens", "512"))
    assert rc == 0 and report["prompt_budget"] is None  # no context known: not checked, and said so
    assert "prompt lengths not checked" in capsys.readouterr().out
    rc, report = run(train, eval_file, tmp_path / "b", 2, *model_args("--tokenizer", str(HF_FILES),
                                                                       "--max-tokens", "512",
                                                                       "--max-context-tokens", "530"))
    assert rc == 2 and report["splits"]["train"]["rejected_by_reason"] == {data.PROMPT_TOO_LONG: 4}


@pytest.mark.usefixtures("local_service")
def test_the_prompt_check_needs_max_tokens_and_a_base_model_the_hub_has(tmp_path, eval_file, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    assert run(train, eval_file, tmp_path / "a", 2, *model_args())[0] == 2
    assert "--max-tokens is required" in capsys.readouterr().err
    rc, _ = run(train, eval_file, tmp_path / "b", 2, "--base-model", "arn:aws:sagemaker:us-west-2:aws:hub-content/"
                "SageMakerPublicHub/Model/no-such-model/1.0.0", "--max-tokens", "512")
    assert rc == 2 and "Could not resolve base model" in capsys.readouterr().err
    assert main(["--train", str(train), "--eval", str(eval_file), "--batch-size", "2", "--output",
                 str(tmp_path / "c"), "--chat-template-kwargs", "[1]"]) == 2
    assert "must be a JSON object" in capsys.readouterr().err
