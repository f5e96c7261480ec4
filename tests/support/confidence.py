"""A second, deliberately plain computation of DeepSpec's confidence-head metrics
(deepspec/eval/dspark/confidence_head.py: cumulative product of the float32 sigmoids in
float64, clamp, 20 coarse bins for ECE and reliability, 1000 fine bins for AUROC with ties
one half, Brier, means), Python loops over (prediction, label) pairs: the oracle of the
metrics, calibration and eval tests."""

from __future__ import annotations

import pytest
import torch


def plain_metrics(steps, block_size, stops, temperatures=None):
    """DeepSpec's per-position metrics, the long way round."""
    pairs = [[] for _ in range(block_size)]
    for proposed, accepted, logits in steps:
        L = len(proposed)
        if accepted > 0 and proposed[accepted - 1] in stops:
            L = accepted
        if L == 0:
            continue
        x = torch.tensor(logits[:L], dtype=torch.float32)
        if temperatures is not None:
            x = x / torch.tensor(temperatures[:L], dtype=torch.float32)
        step = [float(v) for v in torch.sigmoid(x)]      # DeepSpec: sigmoid in float32
        prod = 1.0
        for k in range(L):
            prod *= step[k]                               # then a float64 cumulative product
            p = min(max(prod, 1e-8), 1 - 1e-8)
            pairs[k].append((p, 1.0 if k < accepted else 0.0))
    out = []
    for k, items in enumerate(pairs):
        if not items:
            out.append(dict(position=k, total_weight=0.0, ece=None, auc=None, brier=None,
                            pred_mean=None, target_mean=None, reliability=[]))
            continue
        n = len(items)
        coarse = {}
        for p, y in items:
            coarse.setdefault(min(int(p * 20), 19), []).append((p, y))
        ece = 0.0
        reliability = []
        for b in sorted(coarse):
            group = coarse[b]
            mp = sum(p for p, _ in group) / len(group)
            my = sum(y for _, y in group) / len(group)
            ece += abs(mp - my) * len(group) / n
            reliability.append(dict(bin=b, range=[b / 20, (b + 1) / 20], avg_pred=mp, avg_target=my,
                                    weight=float(len(group))))
        pos = [min(int(p * 1000), 999) for p, y in items if y == 1.0]
        neg = [min(int(p * 1000), 999) for p, y in items if y == 0.0]
        auc = None
        if pos and neg:
            auc = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg) / (len(pos) * len(neg))
        out.append(dict(position=k, total_weight=float(n), ece=ece, auc=auc,
                        brier=sum((p - y) ** 2 for p, y in items) / n,
                        pred_mean=sum(p for p, _ in items) / n, target_mean=sum(y for _, y in items) / n,
                        reliability=reliability))
    return out


# torch's float32 sigmoid can differ by one ulp between its vectorised path (eval sees
# every step at once) and a short tensor (one step, as here and in DeepSpec): ~1e-9 on the
# numbers. Counts, bins and weights are compared exactly.
TOL = 1e-7


def assert_same_metrics(report_entries, plain, tol=TOL):
    assert len(report_entries) == len(plain)
    for got, want in zip(report_entries, plain):
        got = got.model_dump()
        assert got["position"] == want["position"]
        assert got["total_weight"] == want["total_weight"]
        for key in ("ece", "auc", "brier", "pred_mean", "target_mean"):
            if want[key] is None:
                assert got[key] is None, key
            else:
                assert got[key] == pytest.approx(want[key], abs=tol), (want["position"], key)
        assert len(got["reliability"]) == len(want["reliability"])
        for g, w in zip(got["reliability"], want["reliability"]):
            assert g["bin"] == w["bin"] and g["range"] == w["range"] and g["weight"] == w["weight"]
            assert g["avg_pred"] == pytest.approx(w["avg_pred"], abs=tol)
            assert g["avg_target"] == pytest.approx(w["avg_target"], abs=tol)
