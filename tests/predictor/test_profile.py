"""Machine profiles: the paper's built-in machine, TOML round trip, versions, host checks."""

from __future__ import annotations

import tomllib

import pytest

from predictor.costs.profile import (
    PROFILE_VERSION,
    check_host,
    dumps,
    load_profile,
    profile_to_toml,
    save_profile,
    sgi_power_challenge,
)
from predictor.errors import HostMismatchWarning, ProfileError, ProfileVersionError


def test_sgi_parameters_converted_to_ns_and_lines():
    p = sgi_power_challenge()
    m = p.models["paper"]
    assert m["F1"]["acc"] == pytest.approx(8.8)  # 0.0088 us
    assert m["F1"]["l2_misses"] == pytest.approx(970.0)
    # g5 = 0.026 us per 16-B quadword; a 128-B L2 line is 8 quadwords: 208 ns per line.
    assert m["F1"]["l2_writebacks"] == pytest.approx(0.026 * 8 * 1000)
    assert m["F2"]["l2_writebacks"] == pytest.approx(0.18 * 8 * 1000)
    assert m["F3"]["wb"] == pytest.approx(0.051 * 8 * 1000)
    assert p.bsp["DXBSP"]["max"] == pytest.approx([3400.0, 330.0])
    assert p.bsp["EBSP"]["max"] == pytest.approx([1310.0, 5350.0])
    assert (p.processors, p.banks, p.word_bytes) == (8, 8, 4)


def test_round_trip(tmp_path):
    p = sgi_power_challenge()
    path = save_profile(p, tmp_path / "sgi.toml")
    q = load_profile(path)
    assert q.to_dict() == p.to_dict()
    assert profile_to_toml(q) == path.read_text()
    with pytest.raises(ProfileError, match="exists"):
        save_profile(p, path)
    save_profile(p, path, overwrite=True)


def test_dumps_handles_quoted_keys_and_table_arrays():
    d = {"a": {"stream:l1d_misses": 1.5, "x": [1, 2]}, "t": [{"k": "v\"q"}, {"k": "w"}],
         "inf": float("inf"), "none": None}
    assert tomllib.loads(dumps(d)) == {"a": {"stream:l1d_misses": 1.5, "x": [1, 2]},
                                       "t": [{"k": "v\"q"}, {"k": "w"}], "inf": float("inf")}


def test_unknown_version_and_format(tmp_path):
    text = profile_to_toml(sgi_power_challenge())
    f = tmp_path / "p.toml"
    f.write_text(text.replace(f"version = {PROFILE_VERSION}", "version = 7"))
    with pytest.raises(ProfileVersionError, match="version 7 is not supported"):
        load_profile(f)
    f.write_text(text.replace('format = "counterd-machine-profile"', 'format = "x"'))
    with pytest.raises(ProfileError, match="not a machine profile"):
        load_profile(f)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "absent.toml")


def test_host_mismatch_names_the_field():
    p = sgi_power_challenge()
    here = {**p.host, "page_bytes": 4096}
    with pytest.warns(HostMismatchWarning, match=r"page_bytes: 16384 \(profile\) vs 4096"):
        diffs = check_host(p, here)
    assert len(diffs) == 1 and diffs[0].startswith("page_bytes")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_host(p, dict(p.host)) == []
