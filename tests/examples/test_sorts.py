"""examples/bsp_sort.py: the three BSP sorts sort, name their supersteps as Amato et al.'s
Table 2, time them the BSP way, refuse bad arguments in one line, and report a wrong output."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # as a bench script imports it
import bsp_sort  # noqa: E402

RADIX = ["count elements", "prefix sums", "add offsets", "move elements"]
SAMPLE = ["get sample", "count elements", "prefix sum", "fill buckets", "sort buckets"]
COLUMN = ["init", "sort/transpose", "sort/reverse transpose", "sort",
          "right shift/sort/left shift"]
KEYS = ("algo", "keys", "width", "p", "seed", "repeat", "supersteps", "total_s", "sorted")


def _check(res: dict[str, Any], names: list[str]) -> None:
    assert res["sorted"] is True
    assert [s["name"] for s in res["supersteps"]] == names
    assert [s["index"] for s in res["supersteps"]] == list(range(len(names)))
    assert all(s["time_s"] > 0 for s in res["supersteps"])
    assert res["total_s"] == pytest.approx(sum(s["time_s"] for s in res["supersteps"]))


@pytest.mark.parametrize(("width", "bpd", "digits"), [
    (32, 8, 4), (32, 11, 3),  # 11 does not divide 32: a short last digit
    (13, 4, 4), (8, 8, 1), (5, 16, 1), (1, 1, 1),  # bpd >= width: one digit
    (16, 3, 6)])
def test_radix_sorts_with_a_digit_of_bpd_bits(width: int, bpd: int, digits: int) -> None:
    res = bsp_sort.run("radix", keys=1000, width=width, bpd=bpd, p=2, seed=width)
    assert (res["algo"], res["keys"], res["width"], res["bpd"], res["p"]) == \
        ("radix", 1000, width, bpd, 2)
    _check(res, RADIX * digits)


@pytest.mark.parametrize("width", [1, 8, 32])
@pytest.mark.parametrize(("algo", "names"), [("sample", SAMPLE), ("column", COLUMN)])
def test_sample_and_column_sort(algo: str, names: list[str], width: int) -> None:
    res = bsp_sort.run(algo, keys=1000, width=width, p=2, seed=7)
    assert "bpd" not in res
    assert ("oversample" in res) == (algo == "sample")
    _check(res, names)


@pytest.mark.parametrize("algo", bsp_sort.ALGOS)
def test_three_processors_and_an_odd_column_height(algo: str) -> None:
    # p = 3 on any host (pinned round robin); column sort with r = 999: odd, 3 | r.
    res = bsp_sort.run(algo, keys=999, width=32, p=3, seed=3)
    assert res["p"] == 3
    assert res["sorted"] is True


def test_repeats_share_one_input_and_count_up() -> None:
    runs = bsp_sort.run_repeats("sample", keys=2000, oversample=4, p=2, repeats=3)
    assert [r["repeat"] for r in runs] == [0, 1, 2]
    assert all(r["oversample"] == 4 for r in runs)
    a = bsp_sort.make_keys(5, 1, 100, 20)
    assert np.array_equal(a, bsp_sort.make_keys(5, 1, 100, 20))
    assert not np.array_equal(a, bsp_sort.make_keys(6, 1, 100, 20))
    assert not np.array_equal(a, bsp_sort.make_keys(5, 0, 100, 20))
    assert a.dtype == np.uint32 and int(a.max()) < 1 << 20 and int(a.max()) >= 1 << 19


def test_superstep_time_is_the_slowest_processor_and_the_total_their_sum() -> None:
    cfg = bsp_sort.config("sample", keys=10, p=3)
    times = np.array([[5, 9, 1], [2, 2, 3], [7, 1, 1], [1, 1, 1], [4, 8, 6]], dtype=np.int64)
    res = bsp_sort._result(cfg, 2, times)
    assert [s["time_s"] for s in res["supersteps"]] == [9e-9, 3e-9, 7e-9, 1e-9, 8e-9]
    assert res["total_s"] == pytest.approx(28e-9)
    assert res["repeat"] == 2
    assert list(res) == ["algo", "keys", "width", "oversample", "p", "seed", "repeat",
                         "supersteps", "total_s", "sorted"]


def test_verify_accepts_only_a_sorted_permutation() -> None:
    inp = np.array([3, 1, 2, 2, 9], dtype=np.uint32)
    assert bsp_sort.verify(inp, np.array([1, 2, 2, 3, 9], dtype=np.uint32)) is None
    unsorted = bsp_sort.verify(inp, np.array([1, 2, 3, 2, 9], dtype=np.uint32))
    assert unsorted is not None and unsorted.startswith("output not sorted: key 2 = 3 > key 3")
    lost = bsp_sort.verify(inp, np.array([1, 2, 3, 3, 9], dtype=np.uint32))  # sorted, a 2 lost
    assert lost is not None and "not a permutation" in lost and "position 2" in lost
    assert "not a permutation" in (bsp_sort.verify(
        inp, np.array([1, 2, 2, 3, 9], dtype=np.uint32),
        sorted_inp=np.array([1, 2, 2, 3, 8], dtype=np.uint32)) or "")
    assert "4 keys" in (bsp_sort.verify(inp, np.array([1, 2, 3, 9], dtype=np.uint32)) or "")


def _corrupting(kernel: Any, how: str) -> Any:
    def broken(cfg: Any, rank: int, sh: Any, clock: Any) -> np.ndarray:
        out = kernel(cfg, rank, sh, clock)
        if rank == 0 and how == "swap":
            out[[0, -1]] = out[[-1, 0]]
        elif rank == 0 and how == "replace":
            out[0] = out[1]  # still sorted; one key lost, one doubled
        elif rank == 1 and how == "raise":
            raise RuntimeError("deliberate")
        return out
    return broken


@pytest.mark.parametrize(("how", "message"), [
    ("swap", "repeat 0: output not sorted"),
    ("replace", "repeat 0: output is not a permutation of the input"),
    ("raise", "processor 1 failed (exit code 1): RuntimeError: deliberate")])
def test_a_wrong_output_or_a_failed_worker_is_an_error(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], how: str,
        message: str) -> None:
    monkeypatch.setitem(bsp_sort.KERNELS, "column",
                        _corrupting(bsp_sort.KERNELS["column"], how))
    # No daemon, said so: the markers' note on records kept in memory only stays out of it.
    monkeypatch.setenv("COUNTERD_SOCKET", "off")
    with pytest.raises(bsp_sort.SortError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bsp_sort.run("column", keys=1000, width=32, p=2)
    assert bsp_sort.main(["column", "--keys", "1000", "-p", "2"]) == 1
    err = capfd.readouterr().err
    last = err.splitlines()[-1]
    assert last.startswith("bsp_sort: column sort") and message in last
    if how == "raise":  # and the failing worker's traceback, from the worker
        assert err.count("Traceback (most recent call last)") == 2  # run() and main()
    else:
        assert err.count("\n") == 1


def test_json_lines_carry_the_fields_of_each_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert bsp_sort.main(["radix", "--keys", "1e3", "--width", "12", "--bpd", "5", "-p", "2",
                          "--seed", "4", "--repeat", "2", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for i, line in enumerate(lines):
        res = json.loads(line)
        assert set(KEYS) | {"bpd"} == set(res)
        assert (res["keys"], res["width"], res["bpd"], res["seed"], res["repeat"]) == \
            (1000, 12, 5, 4, i)
        _check(res, RADIX * 3)


def test_text_output_names_each_superstep_and_the_total(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert bsp_sort.main(["sample", "--keys", "500", "-p", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("sample sort: 500 keys per processor") and out[0].endswith("sorted")
    assert [line.split(None, 1)[1].rsplit(None, 2)[0] for line in out[1:6]] == SAMPLE
    assert [int(line.split()[0]) for line in out[1:6]] == list(range(5))
    assert out[6].split()[0] == "total" and out[6].endswith(" ms")


def test_batch_writes_one_line_per_run(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    batch = tmp_path / "configs.jsonl"
    batch.write_text('{"algo": "radix", "keys": 800, "width": 16, "bpd": 16}\n'
                     '{"algo": "sample", "keys": 1e3, "oversample": 8, "repeat": 2}\n'
                     "\n"
                     '{"algo": "column", "keys": 600, "width": 20, "seed": 9}\n')
    out = tmp_path / "results.jsonl"
    assert bsp_sort.main(["--batch", str(batch), "--out", str(out), "-p", "2"]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["algo"], r["keys"], r["repeat"]) for r in results] == [
        ("radix", 800, 0), ("sample", 1000, 0), ("sample", 1000, 1), ("column", 600, 0)]
    assert [r["seed"] for r in results] == [0, 0, 0, 9]
    assert results[1]["oversample"] == 8 and results[0]["bpd"] == 16
    _check(results[0], RADIX)
    _check(results[3], COLUMN)
    assert capsys.readouterr().out == ""
    # Without --out, to stdout.
    assert bsp_sort.main(["--batch", str(batch), "-p", "2", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["seed"] for line in lines] == [3, 3, 3, 9]


def test_a_failed_configuration_in_a_batch_is_a_line_and_exit_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(bsp_sort.KERNELS, "sample",
                        _corrupting(bsp_sort.KERNELS["sample"], "swap"))
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"algo": "sample", "keys": 100}\n{"algo": "radix", "keys": 100}\n')
    assert bsp_sort.main(["--batch", str(batch), "-p", "2"]) == 1
    captured = capsys.readouterr()
    first, second = (json.loads(line) for line in captured.out.splitlines())
    assert first["sorted"] is False and "output not sorted" in first["error"]
    assert second["sorted"] is True
    assert "1 of 2 configurations failed" in captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["radix", "--keys", "1000", "--bpd", "0"], "bpd (bits per digit) must be 1..16, not 0"),
    (["radix", "--keys", "1000", "--bpd", "17"], "bpd (bits per digit) must be 1..16, not 17"),
    (["sample", "--keys", "1000", "--width", "33"], "width (bits per key) must be 1..32"),
    (["radix", "--keys", "0"], "keys (per processor) must be 1.."),
    (["column", "--keys", "1001", "-p", "2"], "column sort needs keys per processor"),
    (["column", "--keys", "16", "-p", "4"], "at least 2(p-1)^2 = 18"),
    (["column", "--keys", "30", "-p", "4"], "a multiple of p"),
    (["sample", "--keys", "10", "--bpd", "4"], "bpd (bits per digit) is for radix sort"),
    (["radix", "--keys", "2.5"], "--keys: not an integer"),
    (["heap", "--keys", "10"], "invalid choice: 'heap'"),
    (["radix"], "keys (per processor, n/p) is required"),
    ([], "give an algorithm"),
    (["radix", "--keys", "10", "-p", "0"], "p (processors) must be 1.."),
    (["radix", "--keys", "10", "--batch", "x.jsonl"], "--batch takes its configurations"),
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bsp_sort.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("bsp_sort: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(("line", "message"), [
    ('{"algo": "radix", "keys": NaN}', "line 2: not JSON"),
    ('{"algo": "radix", "keys": 10, "bins": 4}', "line 2: unknown key 'bins'"),
    ('{"algo": "radix"}', 'line 2: needs "algo" and "keys"'),
    ('{"algo": "radix", "keys": true}', "line 2: keys (per processor) must be an integer"),
    ('{"algo": "column", "keys": 7}', "line 2: column sort needs"),
    ("[1, 2]", "line 2: not a JSON object")])
def test_a_bad_batch_line_exits_2_before_anything_runs(
        tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"algo": "radix", "keys": 100}\n' + line + "\n")
    with pytest.raises(SystemExit) as exc:
        bsp_sort.main(["--batch", str(batch), "-p", "2"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the good first line did not run
    assert captured.err == f"bsp_sort: {batch} {message}" + captured.err.split(message, 1)[1]
    assert captured.err.count("\n") == 1


def test_the_file_runs_as_a_program_and_refuses_in_one_line() -> None:
    script = str(ROOT / "examples" / "bsp_sort.py")
    ok = subprocess.run([sys.executable, script, "column", "--keys", "100", "-p", "2",
                         "--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    _check(json.loads(ok.stdout), COLUMN)
    bad = subprocess.run([sys.executable, script, "radix", "--keys", "10", "--bpd", "17"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr == "bsp_sort: bpd (bits per digit) must be 1..16, not 17\n"


def test_loads_from_a_path_without_a_package(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("sorts_from_path",
                                                  ROOT / "examples" / "bsp_sort.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)  # not put in sys.modules
    spec.loader.exec_module(module)
    res = module.run("radix", keys=300, width=10, bpd=10, p=2, repeat=4)
    assert res["repeat"] == 4
    _check(res, RADIX)


def test_markers_carry_the_superstep_names_and_params(tmp_path: Path) -> None:
    import counterd
    from counterd.wire.spool_reader import collect

    counterd.configure(backend="none", spool=tmp_path, socket="off")
    bsp_sort.run("radix", keys=500, width=8, bpd=4, p=2)
    records = sorted(collect(tmp_path), key=lambda r: (r.rank, r.index))
    assert len(records) == 2 * 8
    assert [r.name for r in records if r.rank == 0] == RADIX * 2
    assert {r.rank for r in records} == {0, 1}
    assert records[0].params == {"algo": "radix", "keys": 500, "width": 8, "p": 2, "bpd": 4,
                                 "digit": 0}
    assert [r.params["digit"] for r in records if r.rank == 1] == [0] * 4 + [1] * 4
    assert not any(r.flags for r in records)
