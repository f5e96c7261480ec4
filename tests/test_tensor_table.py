"""The declarative tensor table and its shape expressions."""

from __future__ import annotations

import pytest

from dspark_convert.contract.tensor_table import SYMBOLS, TENSOR_RULES, eval_dim, pretty_dim


def test_eval_dim():
    values = {"H": 10, "r": 3, "m": 4, "nh": 2, "d": 5}
    assert eval_dim("H", values) == 10
    assert eval_dim("m*H", values) == 40
    assert eval_dim("2*r+H", values) == 16
    assert eval_dim("3*r", values) == 9
    assert eval_dim("1", values) == 1
    assert eval_dim("nh*d", values) == 10
    with pytest.raises(ValueError):
        eval_dim("H-r", values)


def test_pretty_dim():
    assert pretty_dim("m*H") == "m·H"
    assert pretty_dim("2*r+H") == "2r+H"
    assert pretty_dim("3*r") == "3r"


def test_table_is_consistent():
    gguf_names = [r.gguf for r in TENSOR_RULES if r.gguf]
    sources = [r.source for r in TENSOR_RULES]
    assert len(set(gguf_names)) == len(gguf_names)
    assert len(set(sources)) == len(sources)
    for rule in TENSOR_RULES:
        for expr in rule.shape:
            eval_dim(expr, {k: 1 for k in SYMBOLS})   # every symbol is known
        assert rule.per_layer == ("{i}" in (rule.gguf or "{i}")) or rule.gguf is None
        if rule.kind == "embedding":
            assert rule.gguf is None
