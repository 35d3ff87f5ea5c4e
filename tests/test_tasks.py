"""The task is a setting (steps/tasks/): the built-in answer formats' graders, the ``task`` config section and
the ``Task`` parameter, validation's grader check on every gold answer, a user's grader from a folder outside
the project, ``make check-task``, and the local run on a user's own files."""
from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from local import run as local_run
from local.toy_data import generate_rows
from steps import validate
from steps.config import ConfigError, TaskConfig, apply_overrides, config_from_dict, load_yaml
from steps.config.parameters import BY_NAME, HYPERPARAMETERS
from steps.gsm8k.answer import grade as gsm8k_grade
from steps.gsm8k.prompt import build_messages
from steps.tasks import BUILTIN_TASKS, build_task, load_examples
from steps.tasks.formats import ANSWER_IS_INSTRUCTION, BOXED_INSTRUCTION, CHOICE_INSTRUCTION
from steps.tasks.rules import GRADER_DISAGREES
from steps.tasks.task import TaskError, load_entry_point

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "config" / "local.yaml"


def nospace(text: str) -> str:
    """``text`` without its whitespace: how a line wrapped at 100 columns is compared."""
    return "".join(text.split())


def task(name: str, **settings):
    return build_task(TaskConfig(name=name, **settings))


def example(name: str, row: dict):
    t = task(name)
    return t, t.read(row, t.fields_for(row))


# -- the graders ---------------------------------------------------------------------------------------
HASH = {"question": "Ann has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"}
BOXED = {"problem": "What is half of one?", "solution": "Half of one is $\\boxed{\\frac{1}{2}}$."}
BOXED_NUMBER = {"problem": "What is 10 times 100?", "solution": "So it is \\boxed{1,000}."}
ANSWER_IS = {"question": "Ann has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\nThe answer is: 7"}
CHOICE = {"question": "Which is a colour?", "choices": ["dog", "blue", "seven"], "answer": "B"}


@pytest.mark.parametrize("name,row,completion,strict,lenient,extracted", [
    # hash: only '#### N' is the instructed form; \boxed, "the answer is" and the last number are lenient
    ("hash", HASH, "so 7 #### 7<eos>", True, True, "7"),
    ("hash", HASH, "#### 7.0", True, True, "7"),  # numbers as exact decimals
    ("hash", HASH, "\\boxed{7}", False, True, "7"),
    ("hash", HASH, "the answer is 7", False, True, "7"),
    ("hash", HASH, "#### 8", False, False, "8"),
    ("hash", HASH, "<think>#### 7</think> #### 8", False, False, "8"),  # the reasoning block is never graded
    ("hash", HASH, "<think>so #### 7", False, False, None),  # cut off inside it: no answer
    # boxed: \boxed{X} with braces balanced, text answers compared without spacing or $ signs
    ("boxed", BOXED, "so \\boxed{\\frac{1}{2}}", True, True, "\\frac{1}{2}"),
    ("boxed", BOXED, "\\ boxed { \\frac { 1 } { 2 } } <eos>", True, True, "\\frac { 1 } { 2 }"),  # the toy's spacing
    ("boxed", BOXED, "\\boxed{\\dfrac{1}{2}}", True, True, "\\dfrac{1}{2}"),
    ("boxed", BOXED, "The answer is: \\frac{1}{2}", False, True, "\\frac{1}{2}"),
    ("boxed", BOXED, "\\boxed{\\frac{1}{3}}", False, False, "\\frac{1}{3}"),
    ("boxed", BOXED, "\\boxed{\\frac{1}{2}", False, False, "2"),  # a box left open: only the last number
    ("boxed", BOXED, "<think>\\boxed{\\frac{1}{2}}</think> I am not sure", False, False, None),
    ("boxed", BOXED_NUMBER, "\\boxed{1000}", True, True, "1000"),
    ("boxed", BOXED_NUMBER, "\\boxed{\\$1,000.00}", True, True, "1000"),
    # answer_is: case-insensitive and whitespace-tolerant, as the toy tokenizer writes it
    ("answer_is", ANSWER_IS, "The answer is: 7", True, True, "7"),
    ("answer_is", ANSWER_IS, "so then the answer is : 7 <eos>", True, True, "7"),
    ("answer_is", ANSWER_IS, "The answer is: 7 apples.", True, True, "7"),
    ("answer_is", ANSWER_IS, "the answer is 7", False, True, "7"),  # no colon: not the instructed form
    ("answer_is", ANSWER_IS, "#### 7", False, True, "7"),
    ("answer_is", ANSWER_IS, "The answer is: 8", False, False, "8"),
    ("answer_is", ANSWER_IS, "<think>The answer is: 7</think>The answer is: 8", False, False, "8"),
    ("answer_is", ANSWER_IS, "<|channel|>analysis<|message|>The answer is: 7", False, False, None),  # harmony
    # choice: a letter of the options, case-insensitive, "(B)" too; the option's text is a lenient answer
    ("choice", CHOICE, "The answer is: B", True, True, "B"),
    ("choice", CHOICE, "the answer is : ( b ) <eos>", True, True, "B"),
    ("choice", CHOICE, "The answer is: A", False, False, "A"),
    ("choice", CHOICE, "The answer is: D", False, False, None),  # not one of the three options
    ("choice", CHOICE, "blue", False, True, "B"),
    ("choice", CHOICE, "answer: b", False, True, "B"),
    ("choice", CHOICE, "<think>The answer is: B</think>", False, False, None),
])
def test_each_builtin_grader_reads_strict_and_lenient_answers_only_in_the_answer_region(
        name, row, completion, strict, lenient, extracted):
    t, ex = example(name, row)
    g = t.grade(completion, ex)
    assert (g.correct, g.correct_lenient, g.extracted) == (strict, lenient, extracted)


@pytest.mark.parametrize("completion", ["#### 7", "\\boxed{7}", "the answer is 7", "7 apples", "#### 8",
                                        "<think>#### 7</think>", "<think>#### 7", "#### 1,000", ""])
def test_the_gsm8k_task_is_gsm8ks_grader_and_prompt_unchanged(completion):
    t, ex = example("gsm8k", HASH)
    assert ex.gold == "7"
    assert t.grade(completion, ex) == gsm8k_grade(completion, "7")
    assert t.messages(ex) == build_messages(HASH["question"])
    assert "gsm8k" in BUILTIN_TASKS and TaskConfig().name == "gsm8k"


def test_prompts_carry_the_fixed_instructions_and_the_options_one_per_line():
    assert example("boxed", BOXED)[0].messages(example("boxed", BOXED)[1])[0]["content"].endswith(BOXED_INSTRUCTION)
    t, ex = example("answer_is", ANSWER_IS)
    assert t.messages(ex) == [{"role": "user", "content": ANSWER_IS["question"] + "\n" + ANSWER_IS_INSTRUCTION}]
    t, ex = example("choice", CHOICE)
    assert t.messages(ex)[0]["content"] == f"Which is a colour?\nA) dog\nB) blue\nC) seven\n{CHOICE_INSTRUCTION}"


@pytest.mark.parametrize("name,row,gold", [
    ("choice", {**CHOICE, "answer": "(c)"}, "C"),
    ("choice", {**CHOICE, "answer": "Blue is a colour. The answer is: B"}, "B"),
    ("boxed", {"problem": "p", "solution": "\\boxed{x^{2}}", "answer": "x^2"}, "x^{2}"),  # prefers the solution
    ("answer_is", {"problem": "p", "solution": "so. The answer is: $18."}, "$18"),
])
def test_gold_answers_are_read_from_the_answer_field(name, row, gold):
    t, ex = example(name, row)
    assert ex.gold == gold
    assert t.check_gold(ex) == (True, "")  # the row's own reference answer gets full marks


# -- the config section and the parameter ---------------------------------------------------------------
def test_the_task_section_its_defaults_and_its_errors_name_the_key():
    assert config_from_dict({}).task == TaskConfig(name="gsm8k")
    assert load_yaml(ROOT / "config" / "default.yaml")["task"] == TaskConfig().model_dump()
    assert config_from_dict({"task": {"grader": "mod:attr"}}).task.name == "custom"  # a grader is the choice
    with pytest.raises(ConfigError, match=r"'task.name' must be one of gsm8k, hash, boxed, answer_is, choice, "
                                          r"number, custom, got 'math'"):
        config_from_dict({"task": {"name": "math"}}, source="c.yaml")
    with pytest.raises(ConfigError, match=r"c.yaml: 'task.grader' is used only with 'task.name: custom'"):
        config_from_dict({"task": {"name": "boxed", "grader": "mod:attr"}}, source="c.yaml")
    with pytest.raises(ConfigError, match=r"'task.grader' must be an entry point package.module:attr"):
        config_from_dict({"task": {"grader": "mod.attr"}}, source="c.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'task.answer'"):
        config_from_dict({"task": {"answer": "x"}}, source="c.yaml")
    # A training job's flat hyperparameters set it like any key.
    raw = apply_overrides({}, {"name": "boxed", "answer_field": "solution"}, "hyperparameters")
    assert config_from_dict(raw).task == TaskConfig(name="boxed", answer_field="solution")


def test_the_task_parameter_overrides_task_name_in_every_step():
    from steps.evaluate import run_task

    p = BY_NAME["Task"]
    assert (p.key, p.kind) == ("task.name", "String") and HYPERPARAMETERS["Task"] == "name"
    with pytest.raises(ConfigError, match=r"'task.name' must be one of .*, got 'math'"):
        local_run.check_params({"Task": "math"}, str(LOCAL))
    # EvaluateModel: the run's task section from model.json, its name from --task (the parameter) when given.
    model_config = {"session": {}, "dapo": {}, "task": {"name": "hash", "answer_field": "solution"}}
    assert run_task(model_config, "boxed")["task"] == {"name": "boxed", "answer_field": "solution"}
    assert run_task({"session": {}}, None)["task"] == {}  # a model.json of before the task section: gsm8k


# -- validation: the grader against every gold answer -----------------------------------------------------
def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def answer_is_rows(n: int, seed: int = 0) -> list[dict]:
    """The toy's questions with answers in the 'The answer is: N' format."""
    return [{"question": r["question"], "answer": r["answer"].replace("\n#### ", " The answer is: ")}
            for r in generate_rows(n, seed)]


def boxed_rows(n: int, seed: int = 0) -> list[dict]:
    """The toy's questions as MATH-style problem/solution rows, the answer in \\boxed{}."""
    return [{"problem": r["question"], "solution": r["answer"].replace("\n#### ", " So it is \\boxed{") + "}."}
            for r in generate_rows(n, seed)]


def test_validation_reads_problem_solution_files_and_reports_the_graders_agreement(tmp_path):
    rows = boxed_rows(12)
    train, eval_ = write(tmp_path / "train.jsonl", rows[:8]), write(tmp_path / "eval.jsonl", rows[8:])
    report = validate.validate(str(train), str(eval_), 4, tmp_path / "out", task=task("boxed"))
    assert report["status"] == "accepted", report["message"]
    assert report["task"] == {"name": "boxed", "instruction": BOXED_INSTRUCTION}
    assert report["grader_agreement"] == {"checked": 12, "agreed": 12, "first_disagreements": []}
    assert report["splits"]["train"]["fields"] == {str(train): {"question": "problem", "answer": "solution",
                                                                "choices": None, "source": "auto-detected"}}
    assert "task boxed: the grader agrees with 12 of 12 gold answers" in report["message"]
    examples = load_examples(tmp_path / "out" / "train.jsonl", task("boxed"))  # what TrainDAPO reads
    assert [ex.gold for ex in examples] == [r["solution"].split("{")[1].split("}")[0] for r in rows[:8]]


def test_choice_rows_need_their_options_and_a_letter_among_them(tmp_path):
    colours = ["red", "blue", "green"]
    rows = [{"question": f"Which colour is number {i}?", "choices": colours, "answer": "ABC"[i % 3]}
            for i in range(9)]
    rows[1] = {**rows[1], "answer": "D"}  # not one of three options
    rows[2] = {**rows[2], "choices": "red, blue"}
    train, eval_ = write(tmp_path / "train.jsonl", rows[:6]), write(tmp_path / "eval.jsonl", rows[6:])
    report = validate.validate(str(train), str(eval_), 2, tmp_path / "out", task=task("choice"))
    assert report["status"] == "accepted", report["message"]
    assert report["splits"]["train"]["rejected_by_reason"] == {"no answer letter of the choices": 1,
                                                               "choices not a list of strings": 1}
    # a bare letter is graded as the instructed 'The answer is: B'; the unreadable letter is a disagreement
    assert report["grader_agreement"]["checked"] == 8 and report["grader_agreement"]["agreed"] == 7
    assert report["splits"]["train"]["fields"][str(train)]["choices"] == "choices"


def test_validation_refuses_gold_answers_its_grader_cannot_read_naming_rows_and_the_fix(tmp_path, capsys):
    rows = generate_rows(12, 0)  # '#### N' answers
    train, eval_ = write(tmp_path / "train.jsonl", rows[:8]), write(tmp_path / "eval.jsonl", rows[8:])
    code = validate.main(["--train", str(train), "--eval", str(eval_), "--batch-size", "2",
                          "--output", str(tmp_path / "out"), "--task", "answer_is"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the answer_is task's grader cannot read the gold answers of eval: it agreed with 0 of 4 rows" in err
    assert f"{eval_}:1: no 'The answer is: ...' final answer (answer ends '#### " in err
    assert "fix: these answers read as the built-in task hash (TASK=hash" in err
    report = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert report["status"] == "refused" and report["grader_agreement"]["agreed"] == 0
    assert report["grader_agreement"]["first_disagreements"][0]["line"] == 1
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_a_row_whose_reference_answer_the_grader_gets_wrong_is_dropped_and_counted(tmp_path):
    rows = answer_is_rows(10)
    # The gold answer is there, but the reference opens a reasoning block it never closes: the grader, which
    # reads only the answer region, finds no answer in it.
    rows[3]["answer"] = "<think>" + rows[3]["answer"]
    train, eval_ = write(tmp_path / "train.jsonl", rows[:8]), write(tmp_path / "eval.jsonl", rows[8:])
    report = validate.validate(str(train), str(eval_), 2, tmp_path / "out", task=task("answer_is"))
    assert report["status"] == "accepted"
    assert report["grader_agreement"]["checked"] == 10
    [bad] = report["grader_agreement"]["first_disagreements"]
    assert (bad["line"], bad["reason"]) == (4, GRADER_DISAGREES)


# -- a user's grader, from a folder outside the project ---------------------------------------------------
GRADER = '''
"""A user's task: answers committed as 'ANSWER: <number>'."""
import re

from steps.dapo.chat import answer_region
from steps.dapo.task import Grade


class WordAnswer:
    instruction = "Write the final answer as ANSWER: followed by the number."

    def grade(self, text, example):
        region = answer_region(text) or ""
        found = re.findall(r"answer\\s*:\\s*(\\d+)", region, re.IGNORECASE)
        right = bool(found) and found[-1] == example.gold.split("####")[-1].strip()
        return Grade(correct=right, formatted=bool(found), extracted=found[-1] if found else None)
{reference}

def make_task():
    return WordAnswer()
'''


def user_grader(folder: Path, reference: bool = True) -> Path:
    """my_grader.py in ``folder``; with ``reference``, it says how its gold answers read as a completion."""
    ref = ("\n    def reference(self, example):\n        return 'ANSWER: ' + example.gold.split('####')[-1].strip()\n"
           if reference else "")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_grader.py").write_text(textwrap.dedent(GRADER).replace("{reference}", ref))
    return folder


def user_config(tmp_path: Path, code_dir: Path) -> Path:
    raw = load_yaml(LOCAL)
    raw["task"] = {"grader": "my_grader:make_task", "code_dir": str(code_dir)}
    path = tmp_path / "mine.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


def test_a_user_grader_is_imported_from_its_folder_and_validates_the_data(tmp_path, capsys):
    code_dir = user_grader(tmp_path / "outside" / "graders")
    with pytest.raises(TaskError, match="cannot import no_such_module"):
        load_entry_point("no_such_module:x", str(code_dir))
    with pytest.raises(TaskError, match="has no attribute nothing"):
        load_entry_point("my_grader:nothing", str(code_dir))
    rows = generate_rows(10, 3)
    train, eval_ = write(tmp_path / "train.jsonl", rows[:7]), write(tmp_path / "eval.jsonl", rows[7:])
    code = validate.main(["--train", str(train), "--eval", str(eval_), "--batch-size", "2", "--output",
                          str(tmp_path / "out"), "--grader", "my_grader:make_task", "--code-dir", str(code_dir)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert report["task"] == {"name": "custom", "grader": "my_grader:make_task", "code_dir": str(code_dir)}
    assert report["grader_agreement"]["agreed"] == 10


# -- make check-task ----------------------------------------------------------------------------------
def test_make_check_task_shows_three_prompts_and_the_graders_verdicts_offline(tmp_path):
    data = tmp_path / "mine"
    write(data / "train.jsonl", answer_is_rows(6))
    out = subprocess.run(["make", "-s", "check-task", f"DATA={data}", "TASK=answer_is"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(f"\n    {ANSWER_IS_INSTRUCTION}") == 3
    assert out.stdout.count("reads '") == 3 and out.stdout.count(": right") == 3
    assert "fields of train.jsonl: question 'question', answer 'answer' (auto-detected)" in out.stdout
    assert f"grader agreement on {data / 'train.jsonl'}: 6 of 6 gold answers read and graded right" in \
        " ".join(out.stdout.split())
    refused = subprocess.run(["make", "-s", "check-task", f"DATA={data}", "TASK=boxed"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "error: the boxed task's grader cannot read the gold answers of train: it agreed with 0 of 6" \
        in " ".join(refused.stderr.split())
    assert "these answers read as the built-in task answer_is" in " ".join(refused.stderr.split())
    # A person's terminal: within 100 columns, the refusal too, and nothing from a library.
    wide = [line for line in (out.stdout + out.stderr + refused.stderr).splitlines() if len(line) > 100]
    assert not wide and "PyTorch" not in out.stderr + refused.stderr, wide


# -- the local run on the user's files ----------------------------------------------------------------
def _run(tmp_path: Path, *extra: str) -> int:
    return local_run.main(["--runs-dir", str(tmp_path / "runs"), "--definition-out", str(tmp_path / "p.json"),
                           "--quiet", *extra])


def test_a_folder_that_does_not_fit_or_a_task_the_toy_data_lacks_is_refused_before_anything_is_created(tmp_path):
    write(tmp_path / "mine" / "train.jsonl", answer_is_rows(4))
    with pytest.raises(Exception, match=r"^--data \S*mine: no held-out file among train.jsonl: .* train and one of "
                                        r"test, validation, eval, val, dev .* the formats read: JSONL"):
        _run(tmp_path, "--data", str(tmp_path / "mine"))
    with pytest.raises(Exception, match=r"task boxed: the generated toy data is GSM8K's format .* --data <dir>"):
        _run(tmp_path, "--task", "boxed")
    with pytest.raises(Exception, match=r"--train-rows shape the generated toy data only"):
        _run(tmp_path, "--data", str(tmp_path / "mine"), "--train-rows", "10")
    assert not (tmp_path / "runs").exists()


def test_the_first_screen_says_what_a_builtin_task_asks_for_and_that_the_toy_learns_it():
    assert local_run.task_notes(task("gsm8k")) == []  # the default run's first screen is unchanged
    assert local_run.task_notes(task("boxed")) == [
        f"task boxed: each prompt ends '{BOXED_INSTRUCTION}' and only that form earns the reward (strict); the local "
        "toy model learns this format"]


#: A plumbing run: one optimizer step of 2 prompts x 4 completions, 4 held-out questions.
SMALL = ("--param", "MaxSteps=1", "--param", "BatchSize=2", "--param", "GroupSize=4", "--param", "EvalSize=4",
         "--param", "MaxNumGenBatches=4")


@pytest.mark.slow
def test_a_user_grader_refused_before_any_session_then_fixed_runs_end_to_end_on_resume(tmp_path, capsys):
    """The user's grader from a folder outside the project, without a reference(): its gold answers
    ('... #### 7') are not in its instructed form, so ValidateData refuses, naming rows; nothing billed. The user
    adds reference() and resumes the run: validation, training, evaluation and the gate all grade with it."""
    code_dir = user_grader(tmp_path / "outside", reference=False)
    data = tmp_path / "mine"
    rows = generate_rows(30, 5)
    write(data / "train.jsonl", rows[:20]), write(data / "test.jsonl", rows[20:])
    code = _run(tmp_path, "--data", str(data), "--config", str(user_config(tmp_path, code_dir)), *SMALL)
    out = capsys.readouterr().out
    assert code == 1
    # Lines are wrapped at 100 columns (a path wider than that is cut): read the first screen without whitespace.
    first_screen = "".join(out.split("[ValidateData] started")[0].split())
    assert nospace("note: task custom (my_grader:make_task): the local toy model learns only the built-in") \
        in first_screen
    assert nospace("training may stop early (a step needs groups whose rewards differ) and the gate is expected to "
                   "reject") in first_screen
    assert nospace(f"data: your files from {data}, copied to ") in first_screen
    assert "[ValidateData] Failed" in out and "TrainDAPO" not in out
    flat = nospace(out.replace("eval.jsonl", "test.jsonl"))
    assert nospace("the custom task's grader cannot read the gold answers of eval: it agreed with 0 of 10 rows") in flat
    assert nospace("test.jsonl:1: the grader does not agree with the gold answer") in flat
    assert "training sessions created: 0" in out  # the local service's ListTrainingSessions
    (d,) = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.txt").exists()]
    # The definition the run ran (as `make pipeline-definition` builds it) carries the grader to every step.
    definition = json.loads((d / "pipeline.json").read_text())
    steps = {s["Name"]: s for s in definition["Steps"]}
    args = steps["ValidateData"]["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert args[-6:] == ["--task", {"Get": "Parameters.Task"}, "--grader", "my_grader:make_task",
                         "--code-dir", str(code_dir)]
    hps = steps["TrainDAPO"]["Arguments"]["HyperParameters"]
    assert (hps["grader"], hps["code_dir"], hps["name"]) == ("my_grader:make_task", str(code_dir),
                                                             {"Get": "Parameters.Task"})
    evaluate = steps["EvaluateModel"]["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert evaluate[evaluate.index("--task") + 1] == {"Get": "Parameters.Task"}
    assert {p["Name"]: p["DefaultValue"] for p in definition["Parameters"]}["Task"] == "custom"
    # ... and ValidateData, run from those arguments, graded with it.
    assert json.loads((d / "validation.json").read_text())["task"]["grader"] == "my_grader:make_task"
    assert not (d / "metrics.jsonl").exists()

    user_grader(tmp_path / "outside", reference=True)  # the fix: say how a gold answer reads as a completion
    code = _run(tmp_path, "--resume", d.name)
    out = capsys.readouterr().out
    for name in ("ValidateData", "TrainDAPO", "EvaluateModel", "CheckAccuracy"):
        assert f"{name:<16} " in out and "Succeeded" in out.split(f"{name:<16} ")[1].splitlines()[0], name
    # The toy does not learn this format (the note said so): the gate rejects, and the run says why.
    assert code == 1 and "[CheckAccuracy] Succeeded in" in out and "model package: Rejected" in out
    validation = json.loads((d / "validation.json").read_text())
    assert validation["status"] == "accepted" and validation["grader_agreement"]["agreed"] == 30
    model = json.loads((d / "model.json").read_text())
    assert model["config"]["task"]["grader"] == "my_grader:make_task"  # TrainDAPO graded with it
    predictions = [json.loads(line) for line in (d / "predictions.jsonl").read_text().splitlines()]
    assert [p["gold"] for p in predictions] == [r["answer"] for r in rows[20:24]]  # the custom gold: the whole answer
    # The user's grader read no 'ANSWER: N' in the toy's '#### N' answers (GSM8K's grader would read them all).
    assert all(not p["formatted"] for p in predictions) and any("#### " in p["completion"] for p in predictions)
    evaluation = json.loads((d / "evaluation.json").read_text())
    assert evaluation["metrics"]["format_error_rate"]["value"] == 1.0
    assert evaluation["base"]["metrics"]["format_error_rate"]["value"] == 1.0
    assert "training sessions created: 2, left running: 0" in out  # TrainDAPO's and EvaluateModel's


#: The cheapest run that still reliably learns a format: 10 optimizer steps of 12 groups at the API's top
#: learning rate take the toy's greedy strict accuracy from 0 (it answers '#### N', the wrong form) to about
#: 0.3 on 40 held-out questions; a local run's fixed cost (its processes, moto, the reports) is most of it.
LEARNS = ("--param", "MaxSteps=10", "--param", "BatchSize=12", "--param", "LearningRate=0.01",
          "--param", "EvalSize=40")


#: One format end to end (a local run costs ~25 s of CPU): the others' reading, prompts and fields are the same
#: code with another TaskSpec, and tests/test_toy_formats.py has the DAPO loop teach the toy every one of them.
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["answer_is"])
def test_a_local_run_on_the_users_files_learns_a_builtin_answer_format(tmp_path, capsys, fmt):
    """`make local-run DATA=<dir> TASK=answer_is` on a MetaMathQA-style (question/answer, 'The answer is: N')
    dataset, no code changed: the trained adapter's strict accuracy beats the base model's, the paired 95% interval
    above 0, and the run is approved."""
    data = tmp_path / "mine"
    rows = generate_rows(240, 7, fmt)
    write(data / "train.jsonl", rows[:200]), write(data / "test.jsonl", rows[200:])
    code = _run(tmp_path, "--data", str(data), "--task", fmt, *LEARNS)
    out = capsys.readouterr().out
    # Lines are wrapped at 100 columns (a path wider than that is cut): read the first screen without whitespace.
    first_screen = "".join(out.split("[ValidateData] started")[0].split())
    assert nospace(f"task {fmt}: each prompt ends '{task(fmt).format.instruction}'") in first_screen
    assert "note: task" not in out  # the toy learns the built-in formats: nothing to warn about
    for name in ("ValidateData", "TrainDAPO", "EvaluateModel", "CheckAccuracy", "ApproveModel"):
        assert f"{name:<16} " in out and "Succeeded" in out.split(f"{name:<16} ")[1].splitlines()[0], name
    (d,) = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.txt").exists()]
    for name in ("validation.json", "metrics.jsonl", "evaluation_base.json", "curves.png"):
        assert (d / name).exists(), name
    validation = json.loads((d / "validation.json").read_text())
    assert validation["task"]["name"] == fmt and validation["grader_agreement"]["agreed"] == 240
    assert json.loads((d / "model.json").read_text())["config"]["task"]["name"] == fmt  # TrainDAPO graded with it
    evaluation = json.loads((d / "evaluation.json").read_text())
    trained, base = evaluation["metrics"]["accuracy"]["value"], evaluation["base"]["metrics"]["accuracy"]["value"]
    assert evaluation["n"] == 40 and trained > base, (trained, base)
    assert evaluation["improvement"]["ci95_low"] > 0, evaluation["improvement"]
    assert evaluation["metrics"]["format_error_rate"]["value"] < evaluation["base"]["metrics"]["format_error_rate"][
        "value"]  # it learned the form the prompt asks for
    assert code == 0 and "outcome: succeeded, model approved" in out
    predictions = [json.loads(line) for line in (d / "predictions.jsonl").read_text().splitlines()]
    assert [p["gold"] for p in predictions] == [example(fmt, r)[1].gold for r in rows[200:]]
