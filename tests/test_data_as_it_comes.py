"""Data as it comes (issue 38, items 1-4): JSONL, JSON, CSV and parquet files, split names as hubs write them, the
common field pairs found or a missing one named with help, the ``number`` task, and every dropped row counted by
reason in check-task and ValidateData alike."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from local import run as local_run
from local.toy_data import generate_rows
from steps import validate
from steps.cli import Refused
from steps.config import TaskConfig
from steps.tasks import build_task, check
from steps.tasks.reader import FORMATS_READ, DataError, iter_lines
from steps.tasks.rows import COMMON_PAIRS
from steps.tasks.splits import find_splits

ROWS = [{"question": "Ann has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "Ben has 9 pens and loses 2. How many are left?", "answer": "9 - 2 = 7\n#### 7"}]


def write(path: Path, rows: list[dict], fmt: str | None = None) -> Path:
    """``rows`` in the format of ``path``'s suffix (``fmt`` "json-lines": JSON Lines under a .json name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = fmt or path.suffix[1:]
    if fmt in ("jsonl", "json-lines"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":  # a list, one object a line: the second object starts on line 3
        path.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    elif fmt == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# -- 1. formats and split names ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,suffix,lines", [
    ("jsonl", ".jsonl", [1, 2]), ("json", ".json", [2, 3]), ("json-lines", ".json", [1, 2]),
    ("csv", ".csv", [2, 4]),  # the header is line 1; the first answer spans two lines
    ("parquet", ".parquet", [1, 2]),  # a row's number in the file
])
def test_each_format_is_read_row_by_row_with_its_line(tmp_path, fmt, suffix, lines):
    f = write(tmp_path / f"train{suffix}", ROWS, fmt)
    read = list(iter_lines(f))
    assert [r.row for r in read] == ROWS and [r.line_no for r in read] == lines
    # ... and ValidateData reads it as it reads JSONL (the cleaned copy is JSONL)
    held_out = write(tmp_path / "held" / f"test{suffix}", [{"question": "Cara has 2 cards and gets 1 more. How many?",
                                                             "answer": "2 + 1 = 3\n#### 3"}] * 2, fmt)
    assert validate.validate(str(f), str(held_out), 1, tmp_path / "out")["status"] == "accepted"
    assert [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()] == ROWS


def test_a_file_that_cannot_be_read_is_refused_naming_it_and_the_formats(tmp_path):
    (tmp_path / "README.md").write_text("# card")
    (tmp_path / "train.txt").write_text("x")
    with pytest.raises(DataError, match=rf"no data file among README.md, train.txt; the formats read: "
                                        rf"{FORMATS_READ.replace('(', '.').replace(')', '.')}"):
        list(iter_lines(tmp_path))
    (tmp_path / "train.json").write_text('[{"question": "q", "answer": "#### 1"},\n {"question": }]')
    with pytest.raises(DataError, match=r"train.json:2: not valid JSON .* one list of objects"):
        list(iter_lines(tmp_path / "train.json"))
    (tmp_path / "train.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"train.parquet: not a readable parquet file"):
        list(iter_lines(tmp_path / "train.parquet"))


@pytest.mark.parametrize("train,held_out,name", [
    ("train.jsonl", "test.jsonl", "test"),
    ("gsm8k-train.json", "eval.json", "eval"),
    ("data/train-00000-of-00001.parquet", "data/validation-00000-of-00001.parquet", "validation"),
    ("train.csv", "val.csv", "val"),
    ("default/train/0000.parquet", "default/dev/0000.parquet", "dev"),
])
def test_each_held_out_split_name_is_found(tmp_path, train, held_out, name):
    for rel in (train, held_out, "README.md"):
        write(tmp_path / rel, ROWS) if not rel.endswith(".md") else (tmp_path / rel).write_text("card")
    splits = find_splits(tmp_path)
    assert (splits.train, splits.held_out, splits.held_out_name) == ((tmp_path / train,), (tmp_path / held_out,), name)


def test_a_hubs_folder_test_is_chosen_over_validation_and_shards_stay_together(tmp_path):
    for rel in ("data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
                "data/validation-00000-of-00001.parquet", "data/test-00000-of-00001.parquet"):
        write(tmp_path / rel, ROWS)
    splits = find_splits(tmp_path, "DATA=")
    assert [f.name for f in splits.train] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    assert (splits.held_out_name, splits.ignored) == ("test", ("validation",))
    write(tmp_path / "socratic" / "train-00000-of-00001.parquet", ROWS)
    with pytest.raises(DataError, match=r"DATA=.*: train files in 2 folders \(data/, socratic/\)"):
        find_splits(tmp_path, "DATA=")


# -- 2. fields --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("question,answer", [*COMMON_PAIRS, ("Question", "Answer")])
def test_the_common_field_pairs_are_found(question, answer):
    row = {"id": 1, question: "Ann has 3 apples and buys 4 more. How many?", answer: "#### 7"}
    task = build_task(TaskConfig())
    fields = task.fields_for(row)
    assert (fields.question, fields.answer, fields.source) == (question, answer, "auto-detected")
    assert task.read(row, fields).gold == "7"


def test_a_misspelled_field_is_named_with_the_files_fields_before_any_service_starts(tmp_path):
    data = tmp_path / "mine"
    write(data / "train.jsonl", [{"qestion": r["question"], "answer": r["answer"]} for r in ROWS])
    write(data / "test.jsonl", ROWS)
    want = (r"train.jsonl has no field 'question' \(task.question_field\); auto-detected: none of the pairs "
            r"question/answer, .* is in it; its fields: qestion, answer; did you mean task.question_field: qestion\?")
    with pytest.raises(Refused, match=want):
        check.check(str(data), build_task(TaskConfig()), out=lambda line: None)
    with pytest.raises(Refused, match=f"--data {re.escape(str(data))}: {want}"):
        local_run.main(["--runs-dir", str(tmp_path / "runs"), "--data", str(data)])
    assert not (tmp_path / "runs").exists()  # refused before anything was created


# -- 3. the number task -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("target,gold", [("42", "42"), ("1,000", "1000"), ("-3.5", "-3.5"), ("3/4", "0.75"),
                                         ("1/3", "1/3"), (42, "42"), (-3.5, "-3.5")])
@pytest.mark.parametrize("completion,strict,lenient", [
    ("so #### {gold}", True, True), ("\\boxed{{{gold}}}", True, True), ("the answer is {gold}", False, True),
    ("#### 41.9", False, False)])
def test_the_number_task_reads_the_whole_field_and_grades_strict_and_lenient(target, gold, completion, strict,
                                                                               lenient):
    task = build_task(TaskConfig(name="number"))
    row = {"prompt": "How many?", "target": target}
    example = task.read(row, task.fields_for(row))
    assert example.gold == gold and task.check_gold(example) == (True, "")
    shown = {"0.75": "3/4"}.get(gold, target if isinstance(target, str) else gold)
    verdict = task.grade(completion.format(gold=shown), example)
    assert (verdict.correct, verdict.correct or verdict.correct_unformatted) == (strict, lenient)


def test_check_task_suggests_number_for_bare_number_answers(tmp_path):
    f = write(tmp_path / "train.parquet", [{"prompt": f"{i} + 1?", "target": i + 1} for i in range(4)])
    with pytest.raises(Refused, match=r"no row the gsm8k task can read \(target not a string 4\); these answers "
                                      r"read as the built-in task number \(TASK=number"):
        check.check(str(f), build_task(TaskConfig()), out=lambda line: None)


# -- 4. nothing dropped in silence ------------------------------------------------------------------------------
def lossy(folder: Path, duplicates: int = 1) -> None:
    """A train file losing a row to each reason, and its held-out file."""
    rows = generate_rows(12, 3)
    lines = [json.dumps(r) for r in rows[:8]] + ['{"question": "cut', json.dumps({"question": "no answer?"}),
                                                   json.dumps({"question": "Q?", "answer": "no number"}),
                                                   json.dumps(rows[9])] + [json.dumps(rows[0])] * duplicates
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    write(folder / "test.jsonl", rows[9:])


def test_check_task_and_validate_data_print_the_same_drops_by_reason_and_refuse_losing_most(tmp_path, capsys):
    lossy(tmp_path / "d")
    shown: list[str] = []
    assert check.check(str(tmp_path / "d"), build_task(TaskConfig()), out=shown.append) == 0
    assert validate.main(["--train", str(tmp_path / "d" / "train.jsonl"), "--eval", str(tmp_path / "d" / "test.jsonl"),
                          "--batch-size", "2", "--output", str(tmp_path / "out")]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data:")]
    drops = [line for line in shown if line.startswith("data:")]
    assert drops == printed  # one function writes both
    assert drops[:6] == ["data: train: 13 rows, 8 kept, 5 dropped (38%)",
                         "data:   invalid JSON 1, first train.jsonl:9 (Invalid control character at: line 1 "
                         "column 18 (char 17))",
                         "data:   missing answer 1, first train.jsonl:10",
                         "data:   no '#### <number>' final answer 1, first train.jsonl:11 (answer ends 'no number')",
                         "data:   duplicate question 1, first train.jsonl:13 (an earlier row asks it, ignoring case "
                         "and spacing)",
                         "data:   also in eval 1, first train.jsonl:12"]
    lossy(tmp_path / "most", duplicates=20)  # 24 of 32 rows lost
    args = ["--train", str(tmp_path / "most" / "train.jsonl"), "--eval", str(tmp_path / "most" / "test.jsonl"),
            "--batch-size", "2", "--output", str(tmp_path / "out2")]
    assert validate.main(args) == 2
    err = capsys.readouterr().err
    assert "train lost 24 of its 32 rows (75%), more than task.max_dropped_share 0.5 allows:" in err
    assert 'allow it: PARAMS="MaxDroppedShare=0.8" (make local-run, make start-pipeline)' in err
    assert validate.main([*args, "--max-dropped-share", "0.8"]) == 0


@pytest.mark.slow
def test_a_hub_parquet_dataset_runs_with_task_number_and_no_config_or_code(tmp_path, capsys):
    """`make check-task DATA=<dir> TASK=number` and `make local-run DATA=<dir> TASK=number` on prompt/target
    parquet files with bare-integer targets and a `validation` split, as a hub has them: no config file, no code.
    The terminal names the rows lost and why."""
    rows = [{"prompt": r["question"], "target": int(r["answer"].rsplit("####", 1)[1])} for r in generate_rows(34, 5)]
    data = tmp_path / "hub"
    write(data / "data" / "train-00000-of-00001.parquet", rows[:24] + rows[:3])  # 3 duplicate questions
    write(data / "data" / "validation-00000-of-00001.parquet", rows[24:])
    assert check.main(["--check", "--task", "number", "--data", str(data)]) == 0
    assert "data: train: 27 rows, 24 kept, 3 dropped (11%)" in capsys.readouterr().out
    code = local_run.main(["--runs-dir", str(tmp_path / "runs"), "--definition-out", str(tmp_path / "p.json"),
                           "--data", str(data), "--task", "number", "--param", "MaxSteps=1", "--param", "BatchSize=2",
                           "--param", "GroupSize=4", "--param", "EvalSize=4", "--param", "MaxNumGenBatches=4"])
    out = capsys.readouterr().out
    assert "[ValidateData] data: train: 27 rows, 24 kept, 3 dropped (11%)" in out
    assert "[ValidateData] data:   duplicate question 3, first train-00000-of-00001.parquet:25" in out
    assert "data: train 24 of 27 rows kept (dropped: duplicate question 3); eval 10 of 10 rows kept" in out
    assert "[TrainDAPO] Succeeded" in out and "[EvaluateModel] Succeeded" in out, out
    assert code in (0, 1)  # one step on the toy: the gate may reject; the data went through every step
