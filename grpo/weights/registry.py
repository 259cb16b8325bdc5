"""The weight-sync methods: one `WeightMethod` entry each (grpo.weights.method says what an entry is).

A new method is one file under grpo/weights (its publisher and receiver) plus one entry here:
two factories that import that file when called, and the method's facts. Its name also goes in
`WeightSync` (grpo.config) and the wire's WEIGHT_METHODS (the codec accepts no other names);
tests/weights/test_registry.py checks the three agree. The factories import lazily: reading an
entry (the launcher, --help) must not load torch.distributed or touch CUDA.
"""
from __future__ import annotations

from grpo.rules.methods import IPC, NCCL, SHARED, TCP
from grpo.weights.method import PublishArgs, ReceiveArgs, WeightMethod


def _slot_publisher(a: PublishArgs):
    """ipc and nccl: two slots on the learner's device (they also serve tcp to samplers that ask)."""
    from grpo.weights.slots import SlotPublisher  # here: reading an entry must not load torch.distributed or touch CUDA

    return SlotPublisher(a.server, a.module, a.dtype, ack_timeout_s=a.ack_timeout_s, method=a.method, host=a.host,
                         nccl_timeout_s=a.nccl_timeout_s, answers=a.answers)


def _ipc_receiver(a: ReceiveArgs):
    from grpo.weights.ipc import IpcReceiver  # here: reading an entry must not load torch.distributed or touch CUDA

    return IpcReceiver(a.policy, a.dtype)


def _ipc_check(device_type: str, lora: bool, bf16_weights: bool) -> str:
    if device_type != "cuda":
        return "--weight-sync ipc needs a CUDA learner; use --weight-sync tcp (or auto) on CPU"
    return ""


def _nccl_receiver(a: ReceiveArgs):
    from grpo.weights.nccl import NcclReceiver  # here: reading an entry must not load torch.distributed or touch CUDA

    return NcclReceiver(a.policy, a.dtype, a.timeout_s)


def _shared_publisher(a: PublishArgs):
    from grpo.weights.shared import SharedPublisher  # here: reading an entry must not load torch.distributed or touch CUDA

    return SharedPublisher(a.server, a.module, a.sync_port, answers=a.answers)


def _shared_receiver(a: ReceiveArgs):
    from grpo.weights.shared import SharedReceiver  # here: reading an entry must not load torch.distributed or touch CUDA

    return SharedReceiver(a.policy, a.sync_port)


def _shared_check(device_type: str, lora: bool, bf16_weights: bool) -> str:
    if device_type != "cuda" or lora or not bf16_weights:
        return ("--weight-sync shared needs a CUDA DeepSpeed learner with --precision bf16 and without LoRA (bf16 "
                "weights the sampler can use as they are); use --weight-sync ipc")
    return ""


def _tcp_publisher(a: PublishArgs):
    from grpo.weights.tcp import TcpPublisher  # here: reading an entry must not load torch.distributed or touch CUDA

    return TcpPublisher(a.server, a.module, a.dtype, answers=a.answers)


def _tcp_receiver(a: ReceiveArgs):
    from grpo.weights.tcp import TcpReceiver  # here: reading an entry must not load torch.distributed or touch CUDA

    return TcpReceiver(a.policy)


# In the order --weight-sync's error lists them (after auto).
REGISTRY: dict[str, WeightMethod] = {}


def register(method: WeightMethod) -> WeightMethod:
    """Add `method` to the registry (a test may add a method of its own the same way)."""
    if method.name in REGISTRY:
        raise ValueError(f"weight-sync method {method.name!r} is registered twice")
    REGISTRY[method.name] = method
    return method


register(WeightMethod(IPC, _slot_publisher, _ipc_receiver, acknowledges=True, cuda_sampler=True, check=_ipc_check))
register(WeightMethod(NCCL, _slot_publisher, _nccl_receiver, acknowledges=True))
register(WeightMethod(SHARED, _shared_publisher, _shared_receiver, own_weights=False, check=_shared_check))
register(WeightMethod(TCP, _tcp_publisher, _tcp_receiver))
