"""The state's wire format: a small skeleton plus one flat buffer per dtype."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from malletrain.elastic.worker.transfer import flatten_by_dtype, join_tensors, split_tensors

pytestmark = pytest.mark.torch


def _trained_payload() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    for opt in (sgd, adam):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    return {"model": model.state_dict(), "sgd": sgd.state_dict(), "adam": adam.state_dict(),
            "extra": {"nested": [torch.arange(3), (torch.tensor(2.5), "x")]},
            "position": {"step": 7, "samples_total": 99}}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_round_trip_through_flat_buffers_is_exact():
    payload = _trained_payload()
    skeleton, tensors = split_tensors(payload)
    # what the receiver does: unpickle the skeleton, cut each dtype's buffer into views
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    received = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    flats = flatten_by_dtype(tensors)
    assert len(flats) == len(received["groups"])  # one buffer per dtype
    views = []
    for (dtype_name, shapes), flat in zip(received["groups"], flats, strict=True):
        assert flat.dtype == getattr(torch, dtype_name)
        offset = 0
        for shape in shapes:
            n = math.prod(shape)
            views.append(flat[offset:offset + n].view(shape))
            offset += n
        assert offset == flat.numel()
    rebuilt = join_tensors(received, views)
    assert _same(payload, rebuilt)
    # and it loads into fresh objects
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    model.load_state_dict(rebuilt["model"])
    torch.optim.Adam(model.parameters(), lr=0.01).load_state_dict(rebuilt["adam"])
