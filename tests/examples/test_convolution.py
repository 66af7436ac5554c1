"""examples/convolution.py: Conv-Shift and Conv-Scan compute the uniform convolution (checked
against scipy's direct convolution), name their supersteps as predictor.families.convolution lists
them,
time them the BSP way, report a wrong output, and refuse bad arguments in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import convolve2d

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # as a bench script imports it
import convolution  # noqa: E402

from predictor.families import convolution as cv  # noqa: E402


def direct(img: np.ndarray, block: int) -> np.ndarray:
    """out[i, j] = sum of img[i-b+1..i, j-b+1..j]: the full 2-D convolution with a b x b box of
    ones, cut to the image."""
    n = img.shape[0]
    return convolve2d(img, np.ones((block, block)))[:n, :n]


@pytest.mark.parametrize(("size", "block"), [(1, 1), (7, 1), (7, 3), (10, 10), (33, 5)])
def test_reference_is_the_direct_convolution(size: int, block: int) -> None:
    img = convolution.image(size, seed=size)
    np.testing.assert_array_equal(convolution.reference(img, block), direct(img, block))


# b = 1; b below the block width; b above the width of a processor's share (L 12 over 2: 6
# columns); odd L over 3 processors; one processor.
@pytest.mark.parametrize(("size", "block", "p"), [
    (16, 1, 2), (40, 4, 2), (12, 9, 2), (21, 5, 3), (30, 4, 1), (25, 25, 2)])
@pytest.mark.parametrize("name", convolution.PROGRAMS)
def test_programs_compute_the_convolution(name: str, size: int, block: int, p: int) -> None:
    res = convolution.run(name, size=size, block=block, p=p, repeats=2)
    assert res["checked"] is True  # every run is compared with reference(); see below
    steps = cv.program(name, size, block, p)
    assert [s["name"] for s in res["supersteps"]] == [s.name for s in steps]
    assert all(s["time_s"] >= 0 for s in res["supersteps"])
    assert len(res["totals_s"]) == 2 and res["total_s"] > 0


def test_a_wrong_output_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = convolution._RUN["scan"]

    def broken(mem, lay, rank, clock):  # type: ignore[no-untyped-def]
        real(mem, lay, rank, clock)
        if rank == 1:  # a lost carry: processor 1's first row one too small
            mem.view(lay.acc, lay.size, lay.size, lay.size)[0, lay.cols[1][0]] -= 1

    monkeypatch.setitem(convolution._RUN, "scan", broken)  # the workers are forked
    with pytest.raises(convolution.ConvolutionError, match=r"out\[0, 10\].*direct sum"):
        convolution.run("scan", size=20, block=3, p=2)


def test_calibration_jobs_time_every_kind_and_transfers() -> None:
    jobs: list[convolution.Job] = [convolution.OpJob(cv.Shape(k, 30, 7, 9, 7, 3, 2), 2)
                                   for k in cv.COMPUTE_KINDS]
    jobs += [convolution.TransferJob("cols", 40, 30, 3, 2),
             convolution.TransferJob("rows", 40, 30, 3, 2)]
    out = convolution.run_jobs(jobs, 2, markers=False)
    for job, t in zip(jobs, out, strict=True):
        assert t.shape == (2, 1, 2)
        if isinstance(job, convolution.TransferJob):
            assert (t[:, 0, 0] == 0).all() and (t[:, 0, 1] > 0).all()  # the copier's time
        else:
            assert (t > 0).all()


@pytest.mark.parametrize("argv", [
    ["shift", "--size", "0", "--block", "1"],
    ["scan", "--size", "10", "--block", "11"],
    ["scan", "--size", "4", "--block", "2", "-p", "5"],
    ["blur", "--size", "10", "--block", "2"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        convolution.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("convolution: ") and err.count("\n") == 1


def test_cli_prints_the_supersteps_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert convolution.main(["shift", "--size", "20", "--block", "2", "-p", "2"]) == 0
    out = capsys.readouterr().out
    assert "conv-shift: L 20, b 2, p 2" in out and "add north 1" in out and "total" in out
