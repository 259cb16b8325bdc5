"""grpo.weights.registry: every method is one entry, and everything that builds or rules a method
goes through it, so a new method is one file plus one entry (a method registered here, in the test,
is built, ruled and applied by the sampler without any other module knowing its name)."""
from __future__ import annotations

import typing
from types import SimpleNamespace

import pytest
import torch
from netutil import free_ports

from grpo import config
from grpo.config import SamplerConfig, from_flat
from grpo.rules import methods as rules
from grpo.sampler.counters import SamplerCounters
from grpo.sampler.weights_client import WeightsClient
from grpo.weights import make_publisher, make_receiver
from grpo.weights.method import PublishArgs, ReceiveArgs, WeightMethod
from grpo.weights.methods import acknowledges, check_method, fallback, learner_method, own_weights, sampler_method
from grpo.weights.registry import REGISTRY
from grpo.weights.tcp import TcpReceiver
from grpo.wire import messages as M
from grpo.wire.transport import SyncClient, SyncServer

GPU, CPU = SimpleNamespace(type="cuda"), SimpleNamespace(type="cpu")   # devices, for make_publisher


def test_the_registry_holds_the_configs_and_the_wires_methods():
    """One name list: --weight-sync's choices less auto, and the methods the codec accepts."""
    assert tuple(REGISTRY) == ("ipc", "nccl", "shared", "tcp")   # --weight-sync's error lists them so
    assert set(REGISTRY) == set(typing.get_args(config.WeightSync)) - {"auto"}
    assert set(REGISTRY) == set(M.WEIGHT_METHODS)
    assert (rules.TCP, rules.IPC, rules.NCCL, rules.SHARED) == M.WEIGHT_METHODS   # the rules spell them as the wire
    assert all(entry.name == name for name, entry in REGISTRY.items())


def test_each_methods_facts_by_hand():
    assert [n for n, e in REGISTRY.items() if e.acknowledges] == ["ipc", "nccl"]   # they read the learner's slot
    assert [n for n, e in REGISTRY.items() if e.cuda_sampler] == ["ipc"]
    assert [n for n, e in REGISTRY.items() if not e.own_weights] == ["shared"]
    assert REGISTRY["ipc"].check("cpu", False, False) == ("--weight-sync ipc needs a CUDA learner; use "
                                                          "--weight-sync tcp (or auto) on CPU")
    assert REGISTRY["ipc"].check("cuda", True, False) == ""
    assert REGISTRY["shared"].check("cuda", False, True) == ""
    assert REGISTRY["shared"].check("cuda", True, True).startswith("--weight-sync shared needs a CUDA DeepSpeed")
    assert REGISTRY["tcp"].check("cpu", True, False) == REGISTRY["nccl"].check("cpu", True, False) == ""


class ToyPublisher:
    def __init__(self, args: PublishArgs):
        self.args = args


class ToyReceiver:
    """Adds the announced version to every parameter, or fails as told."""

    def __init__(self, args: ReceiveArgs):
        self.args, self.outcome = args, True

    def apply(self, announce: M.WeightsAnnounce) -> bool:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        if self.outcome:
            with torch.no_grad():
                for p in self.args.policy.parameters():
                    p.add_(float(announce.version))
        return self.outcome

    def guard(self):
        raise AssertionError("not called here")


def _toy(needs_bf16: str = "toy needs bf16 weights; use --weight-sync tcp") -> WeightMethod:
    return WeightMethod("toy", ToyPublisher, ToyReceiver, acknowledges=True, own_weights=False,
                        check=lambda device_type, lora, bf16: "" if bf16 else needs_bf16)


def test_a_registered_method_is_built_and_ruled_by_its_entry(monkeypatch):
    with pytest.raises(ValueError, match=r"^--weight-sync toy: choose auto, ipc, nccl, shared or tcp$"):
        check_method("toy", "cpu", False, True)
    monkeypatch.setitem(REGISTRY, "toy", _toy())

    pub = make_publisher("toy", "server", "module", CPU, "bf16", "10.0.0.1", 7, 1.5, 2.5, answers="answers")
    assert pub.args == PublishArgs("toy", "server", "module", CPU, "bf16", "10.0.0.1", 7, 1.5, 2.5, "answers")
    rec = make_receiver("toy", "policy", "bf16", 7, 3.0)
    assert rec.args == ReceiveArgs("policy", "bf16", 7, 3.0)
    with pytest.raises(ValueError, match="no weight-sync method 'rdma'"):
        make_receiver("rdma", "policy", "bf16", 7, 3.0)

    check_method("toy", "cpu", False, True)   # its own check passes
    with pytest.raises(ValueError, match=r"^toy needs bf16 weights; use --weight-sync tcp$"):
        check_method("toy", "cuda", False, False)
    with pytest.raises(ValueError, match=r"^--weight-sync rdma: choose auto, ipc, nccl, shared, tcp or toy$"):
        check_method("rdma", "cpu", False, True)
    assert acknowledges("toy") and not own_weights("toy")
    assert sampler_method("toy", "cpu") == learner_method("toy", "cuda") == "toy"
    assert fallback("toy", "toy") == fallback("toy", "auto") == "tcp"   # it steps down to bytes


class Two(torch.nn.Module):
    def __init__(self, values):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(values))


def _client(monkeypatch, policy: torch.nn.Module) -> WeightsClient:
    monkeypatch.setitem(REGISTRY, "toy", _toy())
    cfg = from_flat(SamplerConfig,
                    weight_sync="tcp")   # what --weight-sync said only matters to fallback: toy -> tcp either way
    receiver = make_receiver("toy", policy, torch.float32, cfg.run.sync_port, 1.0)
    return WeightsClient(cfg, None, policy, torch.device("cpu"), 10, receiver, "toy", SamplerCounters(),
                         lambda levels: None)


def _tcp_announce(values, version: int) -> M.WeightsAnnounce:
    """A version sent by tcp, by the registry's own tcp publisher (no socket: its snapshot)."""
    pub = make_publisher("tcp", SyncServer("127.0.0.1", free_ports(1)[0]), Two(values), CPU, None, "127.0.0.1",
                         0, 1.0, 1.0)
    try:
        pub.publish(version, Two(values))
        return pub._snapshot.announce
    finally:
        pub.close()


def test_the_sampler_applies_a_registered_method_through_its_receiver(monkeypatch):
    policy = Two([0.0, 1.0])
    client = _client(monkeypatch, policy)
    toy = lambda v: M.WeightsAnnounce(v, "toy", [], [], [8, 4], [])  # noqa: E731

    assert client._apply(toy(3)) is True   # applied; it acknowledges, so the follow-up request is sent
    assert (client.version, policy.w.tolist()) == (3, [3.0, 4.0])
    assert (client.counters.weight_syncs, client.counters.weight_bytes) == (1, 12)

    client.receiver.outcome = False        # the transfer did not complete: nothing changes, ask again
    assert client._apply(toy(4)) is True
    assert (client.version, policy.w.tolist(), client.counters.weight_syncs) == (3, [3.0, 4.0], 1)

    # The learner answered with bytes instead of what was asked: applied by a tcp receiver made for
    # it, while this sampler keeps asking for toy.
    assert client._apply(_tcp_announce([1.5, -2.0], 5)) is False   # tcp does not acknowledge
    assert (client.version, policy.w.tolist(), client.sync_method) == (5, [1.5, -2.0], "toy")

    client.receiver.outcome = RuntimeError("no toy here")   # impossible here: step down by the rule
    assert client._apply(toy(6)) is True                     # ask again, the new way
    assert client.sync_method == "tcp" and isinstance(client.receiver, TcpReceiver)
    assert (client.version, policy.w.tolist()) == (5, [1.5, -2.0])
    assert client._apply(_tcp_announce([0.25, 8.0], 7)) is False
    assert (client.version, policy.w.tolist(), client.counters.weight_syncs) == (7, [0.25, 8.0], 3)


def test_a_failure_of_the_last_resort_is_raised_not_stepped_down(monkeypatch):
    client = _client(monkeypatch, Two([0.0, 1.0]))
    client.receiver.outcome = RuntimeError("no toy here")
    client._apply(M.WeightsAnnounce(1, "toy", [], [], [8], []))
    assert client.sync_method == "tcp"
    client.receiver.apply = lambda announce: (_ for _ in ()).throw(RuntimeError("bytes broke"))
    with pytest.raises(RuntimeError, match="bytes broke"):   # tcp has nothing to step down to
        client._apply(_tcp_announce([1.0, 2.0], 2))
    assert client.version == 0


def test_tcp_both_sides_from_the_registry_over_a_real_socket():
    learner, sampler = Two([0.5, -4.0]), Two([0.0, 0.0])
    port = free_ports(1)[0]
    pub = make_publisher("auto", SyncServer("127.0.0.1", port), learner, CPU, None, "127.0.0.1", port, 1.0, 1.0)
    client = SyncClient("127.0.0.1", port, M.weights_limits(1 << 20))
    try:
        assert pub.method == "tcp"   # auto on CPU
        pub.publish(1, learner)
        client.send(M.WeightsRequest(sampler_id=0, have_version=0, method=sampler_method("auto", "cpu")))
        msg = client.receive(5.0)
        assert isinstance(msg, M.WeightsAnnounce) and (msg.version, msg.method) == (1, "tcp")
        receiver = make_receiver("tcp", sampler, torch.float32, port, 1.0)
        assert receiver.apply(msg) is True
        assert sampler.w.tolist() == [0.5, -4.0]
    finally:
        client.close()
        pub.close()
