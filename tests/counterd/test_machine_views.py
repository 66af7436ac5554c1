"""Views of the machine record (counterd.machine.views): the node a run uses, and the
geometry / bank_map sections of results files and profiles."""

from __future__ import annotations

import pickle

import pytest

from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap
from counterd.machine.views import BankTable, GeometryTable, NodeView
from tests.machine_files import load


def test_node_view_takes_the_record_parts_and_says_when_a_bank_map_is_given() -> None:
    m = load("xeon-2s-64cpu")
    cpus = m.memory.spread(m.memory.cpus)
    v = NodeView.of(m, cpus, name=m.hostname)
    assert (v.geometry, v.bank_map, v.bank_provenance, v.page_bytes, v.memory, v.cpus) == (
        m.geometry, m.bank_map, m.bank_provenance, m.page_bytes, m.memory, cpus)
    g = Geometry.from_spec("L1=4K/4/64,L2=32K/8/64")
    given = NodeView.of(m, cpus, geometry=g, bank_map=BankMap(12, 256))
    assert given.geometry == g and given.bank_provenance == "given: 12 banks x 256 B"
    doc = given.to_json()
    assert doc["geometry"]["spec"] == g.spec() and doc["rank_cpus"] == list(cpus)
    assert GeometryTable(doc["geometry"]).cache_levels() == g.levels


def test_sections_read_back_typed_and_write_back_as_written() -> None:
    m = load("amd-2cpu-32m")
    written = GeometryTable.of(m.geometry).to_dict()
    # A reader's table: levels out of order and a key no writer of today knows.
    table = {"source": "hand", "extra": 1, **written,
             "levels": list(reversed(written["levels"]))}
    g = GeometryTable(table)
    assert g.levels == tuple(lv.level for lv in m.levels)
    assert g.caches_spec == m.caches_spec
    assert list(g.to_dict()) == list(table) and g.to_dict() == table
    b = BankTable({"provenance": "p", "banks": 4})
    assert (b.banks, b.provenance, list(b)) == (4, "p", ["provenance", "banks"])
    assert BankTable({}).banks == 1
    assert pickle.loads(pickle.dumps(b)) == b and BankTable.wrap(b) is b
    with pytest.raises(KeyError):
        GeometryTable({"spec": "x"}).cache_levels()
