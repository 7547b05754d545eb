"""benchmarks/harness.py: the main skeleton, the shared parser, outputs, resumable records and child-process results."""

from __future__ import annotations

import json
import sys

import pytest
from bench_scripts import ROOT, bench_module

H = bench_module("harness")


def test_main_runs_the_work_and_writes_its_outputs_or_only_reports(tmp_path):
    p = H.parser("doc", out="x", quick="small", threads=False)
    p.add_argument("--no-plot", action="store_true")
    H.add_report_arg(p, "x")
    seen = []

    def run(job):
        seen.append((job.name, job.out, job.args.quick))
        job.save({"rows": [1], "wall_time_s": None})  # what an interrupted run leaves
        return job.header(torch_info=False, rows=[1, 2], wall_time_s=None)

    def markdown(result):
        return f"{len(result['rows'])} rows; {H.timing_line(result)}"

    def plot(result, path):
        path.write_text("png")

    out = tmp_path / "o"
    result = H.main("x", p, run, markdown, plot, argv=["--quick", "--out", str(out)], torch=False)
    assert seen == [("x", out, True)] and result["benchmark"] == "x" and result["wall_time_s"] >= 0
    assert json.loads((out / "x.json").read_text())["rows"] == [1, 2] and (out / "x.png").read_text() == "png"
    assert (out / "x.md").read_text().startswith("2 rows; Wall time: ")
    (out / "x.md").unlink()
    reported = H.main("x", p, run, markdown, plot, argv=["--report", "--no-plot", "--out", str(out)], torch=False)
    assert len(seen) == 1 and reported["rows"] == [1, 2] and (out / "x.md").exists()
    # a child process's run (or a script that writes its own files) returns no dict: nothing is written
    assert H.main("y", p, lambda job: 3, markdown, argv=["--out", str(tmp_path / "y")], torch=False) == 3
    assert list((tmp_path / "y").iterdir()) == []


def test_previous_resumes_only_the_same_settings(tmp_path):
    job = H.Run("r", None, tmp_path, H.Stopwatch())
    assert job.previous({"a": 1}) == {}
    job.save({"settings": {"a": 1}, "rows": [3]})
    assert job.previous({"a": 1})["rows"] == [3] and job.previous({"a": 2}) == {}


def test_parser_adds_only_the_options_asked_for():
    p = H.parser("doc", out="thing", quick="small settings", seed=3, progress=True)
    args = p.parse_args([])
    assert args.out == str(ROOT / "benchmarks" / "out" / "thing")
    assert (args.quick, args.seed, args.no_progress, args.threads) == (False, 3, False, None)
    bare = H.parser("doc", threads=False).parse_args([])
    assert vars(bare) == {}
    model = H.parser("doc", model=True).parse_args(["--seq-len", "32", "--threads", "1"])
    assert (model.model, model.seq_len, model.threads, model.seed, model.batch_size) == ("smollm2-135m", 32, 1, 0, 8)
    assert H.parser("doc", out="").parse_args([]).out == str(ROOT / "benchmarks" / "out")
    with pytest.raises(SystemExit):
        H.parser("doc", threads=False).parse_args(["--threads", "1"])


def test_outputs_and_machine(tmp_path):
    args = H.parser("doc", out="x").parse_args(["--out", str(tmp_path / "a" / "b")])
    out = H.out_dir(args)
    assert out.is_dir()
    js, md = H.write_outputs(out, "r", {"n": 1, "p": tmp_path}, "# title")
    assert json.loads(js.read_text()) == {"n": 1, "p": str(tmp_path)} and md.read_text() == "# title\n"
    info = H.machine(torch_info=False)
    assert info["cores"] >= 1 and "torch" not in info
    assert H.machine_line(info).startswith(f"{info['cpu']}, {info['cores']} cores, load average ")


def test_record_log_resumes_and_starts_fresh(tmp_path):
    path = tmp_path / "runs.jsonl"
    log = H.RecordLog(path, ("instance", "M"))
    assert log.get(instance="a", M=2) is None
    log.add({"instance": "a", "M": 2, "value": 1.5})
    log.add({"instance": "a", "M": 3, "value": 2.5})
    again = H.RecordLog(path, ("instance", "M"))
    assert again.get(instance="a", M=2)["value"] == 1.5 and again.get(instance="a", M=4) is None
    assert len(path.read_text().splitlines()) == 2
    assert H.RecordLog(path, ("instance", "M"), fresh=True).get(instance="a", M=2) is None and not path.exists()


def test_child_results_travel_as_one_line_and_a_failing_child_says_why(tmp_path, capsys):
    H.print_result({"a": 1, "p": tmp_path})
    line = capsys.readouterr().out.strip()
    assert line.startswith(H.RESULT) and json.loads(line[len(H.RESULT) :]) == {"a": 1, "p": str(tmp_path)}
    # a bad option: the child exits with argparse's error, which the parent's message carries
    with pytest.raises(SystemExit, match="(?s)benchmarks.fisher_instances.*unrecognized arguments"):
        H.run_in_process("fisher_instances", "--out", str(tmp_path), "--no-such-option")


def test_command_line_names_the_module(monkeypatch):
    class Spec:
        name = "benchmarks.solvers"

    monkeypatch.setattr(sys.modules["__main__"], "__spec__", Spec(), raising=False)
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/solvers.py", "--quick", "a b"])
    assert H.command_line() == ".venv/bin/python -m benchmarks.solvers --quick 'a b'"
