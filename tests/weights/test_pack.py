"""Coalesced publishing (grpo.weights.pack): parameters laid out as DeepSpeed ZeRO-2 leaves them
(views of one flat bf16 buffer) are copied as a few runs, and the published bytes are exactly
those of the per-tensor path."""
import pytest
import torch
from netutil import free_ports

from grpo.weights.layout import plan_layout, unpack_views
from grpo.weights.pack import Coalescer, pack
from grpo.weights.slots import SlotPublisher
from grpo.wire.transport import SyncServer

BF = torch.bfloat16
# (name, shape, element offset in the flat buffer or None for a storage of its own)
FLAT = [
    ("w0", (4, 8), 0), ("w1", (16,), 32), ("w2", (8, 8), 48),
    ("odd", (7,), 112),      # 14 bytes: padded to 16 in the layout, not in the flat buffer
    ("w3", (16,), 119), ("w4", (32,), 135),
    ("sep", (5,), None),     # a storage of its own
    ("tr", (3, 4), None),    # transposed: not contiguous
    ("f32", (6,), None),     # float32, published as bf16: needs a cast
    ("g0", (16,), 200), ("g1", (8,), 216),
    ("z", (0,), None),       # no bytes: neither copied nor a gap
    ("h", (16,), 224),
    ("k0", (8,), 300), ("k1", (8,), 292),   # adjacent in the layout, reversed in the flat buffer
]


class ZeroLike(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.flat = torch.randn(320).to(BF)
        for name, shape, off in FLAT:
            if name == "tr":
                t = torch.randn(4, 3).to(BF).t()
            elif name == "f32":
                t = torch.randn(*shape)
            else:
                t = torch.randn(*shape).to(BF)
            p = torch.nn.Parameter(t)
            if off is not None:   # what DeepSpeed does: p.data = flat.narrow(0, off, n).view(shape)
                n = int(torch.Size(shape).numel())
                p.data = self.flat[off:off + n].view(shape)
            self.register_parameter(name, p)


def _layout(model):
    named = list(model.named_parameters())
    return named, *plan_layout([(n, p.detach().to("meta", BF)) for n, p in named])


def _per_tensor(named, layout, nbytes):
    """What SlotPublisher wrote before coalescing: one _foreach_copy_ over per-tensor views."""
    flat = torch.zeros(sum(nbytes) + 64, dtype=torch.uint8)
    starts = [sum(nbytes[:b]) for b in range(len(nbytes))]
    views = unpack_views(layout, [flat[s:s + n] for s, n in zip(starts, nbytes)])
    with torch.no_grad():
        torch._foreach_copy_([views[n] for n, _ in named], [p.detach() for _, p in named])
    return flat


def test_plan_runs_and_bytes_match_the_per_tensor_path():
    m = ZeroLike()
    named, layout, dtypes, nbytes = _layout(m)
    assert dtypes == ["bfloat16"] and sum(nbytes) == 512
    c = Coalescer(layout, nbytes)
    flat = torch.zeros(sum(nbytes) + 64, dtype=torch.uint8)
    plan = c.copy_into(flat, [p for _, p in named])
    names = [n for n, _ in named]
    # Worked out by hand (layout offsets: w0 0, w1 64, w2 96, odd 224, w3 240, w4 272, ...):
    #   w0 w1 w2 odd: adjacent on both sides (238 bytes); w3 starts at flat byte 238 but layout
    #   byte 240 (odd's padding) -> a new run w3 w4; sep/tr/f32 break it; g0 g1 (z) h run again;
    #   k0 k1 are adjacent in the layout but not in the flat buffer.
    assert [(names[r.first], r.count, r.offset, r.nbytes) for r in plan.runs] == [
        ("w0", 4, 0, 238), ("w3", 2, 240, 96), ("g0", 3, 400, 80)]
    assert [names[i] for i in plan.singles] == ["sep", "tr", "f32", "k0", "k1"]
    assert plan.copies == 8 and len(named) == 15
    assert torch.equal(flat, _per_tensor(named, layout, nbytes))   # every byte, padding included


def test_plan_is_kept_while_storages_stay_and_rebuilt_when_one_moves():
    m = ZeroLike(1)
    named, layout, _, nbytes = _layout(m)
    c = Coalescer(layout, nbytes)
    flat = torch.zeros(sum(nbytes) + 64, dtype=torch.uint8)
    c.copy_into(flat, list(m.parameters()), cache_key=0)
    with torch.no_grad():   # an optimizer step: in place, the storages stay
        m.flat.mul_(-2)
        for p in (m.sep, m.tr, m.f32):
            p.add_(1)
    named = list(m.named_parameters())
    plan = c.copy_into(flat, [p for _, p in named], cache_key=0)
    assert c.replans == 1 and len(plan.runs) == 3                 # same plan, same cached views
    assert torch.equal(flat, _per_tensor(named, layout, nbytes))  # ... reading the new values

    m.w3.data = m.w3.data.clone()   # moved to a storage of its own (as a checkpoint load may do)
    named = list(m.named_parameters())
    plan = c.copy_into(flat, [p for _, p in named], cache_key=0)
    names = [n for n, _ in named]
    assert c.replans == 2
    assert [(names[r.first], r.count) for r in plan.runs] == [("w0", 4), ("g0", 3)]
    assert [names[i] for i in plan.singles] == ["w3", "w4", "sep", "tr", "f32", "k0", "k1"]
    assert torch.equal(flat, _per_tensor(named, layout, nbytes))


def test_tcp_pack_with_runs_writes_the_same_tensor_bytes():
    m = ZeroLike(2)
    named, layout, _, nbytes = _layout(m)
    c = Coalescer(layout, nbytes)
    plain = unpack_views(layout, pack(named, layout, nbytes))
    runs = unpack_views(layout, pack(named, layout, nbytes, c))
    assert len(c.plan.runs) == 3
    for name, _ in named:   # padding is uninitialised in both (receivers never read it)
        a, b = plain[name].reshape(-1).view(torch.uint8), runs[name].reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), name


def test_a_host_that_cannot_pin_gets_pageable_snapshots_and_one_warning(monkeypatch, caplog):
    """Pinning can fail (host RAM, ulimit -l): the snapshot is then pageable, as before, and the
    warning comes once, not once a version."""
    import grpo.weights.pack as pk

    real = torch.empty

    def no_pinning(*a, pin_memory=False, **kw):
        if pin_memory:
            raise RuntimeError("CUDA error: out of memory\nmore")
        return real(*a, **kw)

    monkeypatch.setattr(pk, "_PIN_FAILED", False)
    monkeypatch.setattr(pk.torch, "empty", no_pinning)
    with caplog.at_level("WARNING", logger="grpo.weights.pack"):
        a, b = pk._host_buffer(64, pin=True), pk._host_buffer(64, pin=True)
    assert a.numel() == b.numel() == 64 and a.dtype == torch.uint8
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "could not pin 0.0 GB" in warnings[0] and "(CUDA error: out of memory)" in warnings[0]
    assert pk._host_buffer(8, pin=False).numel() == 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tcp_pack_of_cuda_tensors_lands_in_pinned_memory_with_the_same_bytes():
    """A snapshot of CUDA tensors is copied into pinned host memory (device-to-host at the link's
    speed), byte for byte what the CPU path writes; CPU tensors stay in pageable memory."""
    m = ZeroLike(3)
    named, layout, _, nbytes = _layout(m)
    cpu = pack(named, layout, nbytes)
    assert not cpu[0].is_pinned()
    flat = m.flat.cuda()   # the views of one flat buffer stay views, on the GPU (runs to coalesce)
    for name, shape, off in FLAT:
        p = getattr(m, name)
        n = int(torch.Size(shape).numel())
        p.data = flat[off:off + n].view(shape) if off is not None else p.data.cuda()
    named_gpu = list(m.named_parameters())
    c = Coalescer(layout, nbytes)
    for coalescer in (None, c):
        gpu = pack(named_gpu, layout, nbytes, coalescer)
        assert all(b.is_pinned() for b in gpu)
        a, b = unpack_views(layout, cpu), unpack_views(layout, gpu)
        for name, _ in named:
            assert torch.equal(a[name].reshape(-1).view(torch.uint8), b[name].reshape(-1).view(torch.uint8)), name


def test_ipc_publisher_slots_hold_the_per_tensor_bytes():
    """The slot publisher on CPU (as the nccl-on-gloo tests run it): both slots, two versions."""
    m = ZeroLike(3)
    port = free_ports(1)[0]
    pub = SlotPublisher(SyncServer("127.0.0.1", port), m, BF, method="nccl")
    try:
        for v in (1, 2):
            with torch.no_grad():
                m.flat.add_(1.0)
                m.sep.add_(1.0)
            pub.publish(v, m)
            named = list(m.named_parameters())
            slot = pub._snapshot.slot
            ref = _per_tensor(named, pub.layout, pub.bucket_nbytes)
            assert torch.equal(pub.slots[slot][:pub.total], ref[:pub.total])
            assert int(pub.stamps[slot].item()) == v
        assert pub.coalescer.replans == 1 and len(pub.coalescer.plan.runs) == 3
    finally:
        pub.close()


@pytest.mark.slow
def test_a_real_deepspeed_zero2_model_publishes_in_one_copy():
    """DeepSpeed ZeRO-2 (CPU, gloo, world 1; the repo's deepspeed.json): every parameter is a
    view of one flat buffer, so the whole model is one run, before and after an optimizer step."""
    from engines import _engine, _train_step

    from grpo.model.zoo import resolve_model

    engine = _engine("deepspeed", resolve_model("tiny-random"))
    named = list(engine.module.named_parameters())
    layout, _, nbytes = plan_layout(named)
    c = Coalescer(layout, nbytes)
    for step in (0, 1):
        if step:
            _train_step(engine, 1)
            named = list(engine.module.named_parameters())
        flat = torch.zeros(sum(nbytes) + 64, dtype=torch.uint8)
        plan = c.copy_into(flat, [p for _, p in named], cache_key=0)
        assert [(r.count, r.nbytes) for r in plan.runs] == [(len(named), sum(nbytes))] and not plan.singles
        assert torch.equal(flat, _per_tensor(named, layout, nbytes))
    assert c.replans == 1   # DeepSpeed re-points p.data after each step, to the same addresses
