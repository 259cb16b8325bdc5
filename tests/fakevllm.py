"""A stand-in for vLLM's LLMEngine as grpo.generate.vllm_engine.VllmEngine uses it (add_request, step,
abort_request, apply_model, get_num_unfinished_requests, reset_prefix_cache), over a Hugging Face
model on CPU, so the engine's stream, weight copies and bookkeeping run where vLLM cannot.

What it keeps of vLLM 0.25's in-process engine: every step draws one token for every request in
flight (a new request's first token at its first step, from its prompt), outputs come as DELTA
(each step's new token, with its log-prob as SamplingParams(logprobs=0) gives it under
logprobs_mode="processed_logprobs": after the temperature, greedy at temperature 0), a request ends
at one of its stop_token_ids ('stop', the token kept) or at max_tokens ('length'), and load_weights
copies (name, tensor) pairs into its model in place. What it does not: it keeps no KV cache (each
step is a full forward over prompt and tokens so far, with the weights in force), so a token's
log-prob is that of a teacher-forced pass of the version that drew it over the whole sequence.

FakeTPLLM: the same over several GPUs as the sampler sees vLLM's engine then: the weights go by
collective_rpc(method name, args) to worker processes, each a FakeWorker (our loader,
grpo.generate.vllm_worker.WeightLoader, as vLLM mixes it into its Worker), the message through
msgpack as vLLM's engine-core client sends it (anything but plain values fails there), once per
worker (one a rank, kept for the run, as vLLM's are); the calls are recorded. Its workers share one model (the tensors' shards are vLLM's
business, not the engine's). A tensor's handle (`share`) names it in the stand-in's own table, which
a worker's rebuild reads: the part CUDA IPC plays on a GPU.

FakeMPLLM: one worker, with vLLM's engine core in a process of its own as the sampler sees it then:
a thread steps the requests in flight on its own, ahead of the reader by up to `lead` steps, and
queues each step's outputs with its stamp (time.monotonic() when they were made); the sampler reads
them through engine_core.get_output and output_processor.process_outputs; a collective_rpc runs
between two of its steps, after the thread has run as far ahead as it may.
"""
from __future__ import annotations

import copy
import queue
import threading
import time
from types import SimpleNamespace

import msgpack
import torch

from grpo.generate.vllm_worker import WeightLoader, plain_args


class FlatLogprobs:
    """vLLM 0.25's FlatLogprobs as a DELTA output carries it (SamplingParams(flat_logprobs=True)): flat
    lists over positions x entries, position i's entries at start_indices[i]:end_indices[i], the
    sampled token's first; its length is the number of positions."""

    def __init__(self, start_indices, end_indices, token_ids, logprobs):
        self.start_indices, self.end_indices = list(start_indices), list(end_indices)
        self.token_ids, self.logprobs = list(token_ids), list(logprobs)
        self.ranks = [None] * len(self.logprobs)
        self.decoded_tokens = [None] * len(self.logprobs)

    def __len__(self) -> int:
        return len(self.start_indices)


class FakeLLM:
    def __init__(self, model: torch.nn.Module, seed: int = 0):
        self.model = copy.deepcopy(model).eval()   # its own weights, as vLLM's engine holds its own
        self.requests: dict[str, dict] = {}
        self.gen = torch.Generator().manual_seed(seed)
        self.aborted: list[str] = []
        self.loads = 0
        self.prefix_resets = 0
        self.most_live = 0
        self.steps = 0

    def add_request(self, request_id: str, prompt: dict, params) -> str:
        assert request_id not in self.requests
        self.requests[request_id] = {"ids": list(prompt["prompt_token_ids"]), "params": params, "out": []}
        return request_id

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def abort_request(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.requests.pop(rid)
            self.aborted.append(rid)

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True

    def apply_model(self, fn):
        return [fn(self)]

    def load_weights(self, weights) -> set[str]:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)
        self.loads += 1
        return set(params)

    @torch.no_grad()
    def step(self) -> list:
        self.steps += 1
        self.most_live = max(self.most_live, len(self.requests))
        outs = []
        for rid, r in list(self.requests.items()):
            p = r["params"]
            logits = self.model(input_ids=torch.tensor([r["ids"] + r["out"]])).logits[0, -1].float()
            if p.temperature == 0:
                lp = torch.log_softmax(logits, -1)
                tok = int(logits.argmax())
            else:
                lp = torch.log_softmax(logits / p.temperature, -1)
                tok = int(torch.multinomial(lp.exp(), 1, generator=self.gen))
            r["out"].append(tok)
            reason = "stop" if tok in p.stop_token_ids else "length" if len(r["out"]) >= p.max_tokens else None
            logprobs = FlatLogprobs([0], [1], [tok], [float(lp[tok])]) if getattr(p, "flat_logprobs", False) \
                else [{tok: SimpleNamespace(logprob=float(lp[tok]))}]
            outs.append(SimpleNamespace(request_id=rid, finished=reason is not None, outputs=[SimpleNamespace(
                token_ids=[tok], logprobs=logprobs, finish_reason=reason)]))
            if reason is not None:
                del self.requests[rid]
        return outs


class FakeWorker(WeightLoader):
    """vLLM's Worker with our loader mixed in, on the stand-in: its model is the stand-in (whose
    load_weights copies into its model), and a handle's rebuild looks the tensor up."""

    def __init__(self, llm: "FakeTPLLM"):
        self.llm = llm
        self.table = llm.shared

    def get_model(self):
        return self.llm

    def grpo_rebuild(self, tensor_cls, size, stride, offset, storage_cls, dtype, device, handle, *rest):
        t = self.table[handle]
        assert (tensor_cls, tuple(size), tuple(stride), offset, dtype) == (type(t), tuple(t.shape), t.stride(),
                                                                         t.storage_offset(), t.dtype)
        return t


class FakeTPLLM(FakeLLM):
    def __init__(self, model: torch.nn.Module, tensor_parallel: int = 2, seed: int = 0):
        super().__init__(model, seed)
        self.tensor_parallel = tensor_parallel
        self.rpc_calls: list[tuple] = []   # (method, args) as each call's message carried them
        self.shared: dict[bytes, torch.Tensor] = {}
        self.workers = [FakeWorker(self) for _ in range(tensor_parallel)]   # one a rank, for the whole run

    def share(self, t: torch.Tensor) -> list:
        """A handle as grpo.generate.vllm_worker.handle_of gives one, its IPC handle a key of this table."""
        key = f"handle{len(self.shared)}".encode()
        self.shared[key] = t
        return plain_args((type(t), t.size(), t.stride(), t.storage_offset(), torch.storage.TypedStorage, t.dtype, 0,
                           key, t.untyped_storage().nbytes(), 0, t.requires_grad, b"ref", 0, b"event", True))

    def collective_rpc(self, method, timeout=None, args: tuple = (), kwargs: dict | None = None) -> list:
        message = msgpack.packb([method, list(args), kwargs or {}], use_bin_type=True)   # plain values only
        out = []
        for worker in self.workers:
            name, a, kw = msgpack.unpackb(message, raw=False)   # each worker's copy of the one message
            self.rpc_calls.append((name, a))
            out.append(getattr(worker, name)(*a, **kw))
        self.shared.clear()   # a handle maps once: a later call naming it again finds nothing
        return out


class FakeMPLLM(FakeTPLLM):
    def __init__(self, model: torch.nn.Module, seed: int = 0, lead: int = 2):
        super().__init__(model, 1, seed)
        self.lead = lead
        self.lock = threading.Lock()   # held for a step, a request's arrival or abort, and a call: one at a time
        self.outputs: queue.Queue = queue.Queue()
        self.engine_core = SimpleNamespace(get_output=self.get_output, abort_requests=lambda ids: None,
                                           shutdown=self.shutdown)
        self.shutdowns = 0   # engine_core.shutdown() calls (VllmEngine.close)
        self.output_processor = SimpleNamespace(process_outputs=self.process_outputs)
        self.running = True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while self.running:
            with self.lock:
                outs = FakeLLM.step(self) if self.requests and self.outputs.qsize() < self.lead else None
                if outs is not None:
                    self.outputs.put(SimpleNamespace(outputs=outs, timestamp=time.monotonic()))
            if outs is None:
                time.sleep(0.0005)

    def get_output(self):
        return self.outputs.get(timeout=60)

    @staticmethod
    def process_outputs(outputs, engine_core_timestamp=None, iteration_stats=None):
        return SimpleNamespace(request_outputs=outputs, reqs_to_abort=[])

    def step(self):
        raise AssertionError("with its engine core in a process of its own, the sampler reads outputs itself")

    def add_request(self, request_id, prompt, params):
        with self.lock:
            return super().add_request(request_id, prompt, params)

    def abort_request(self, request_ids):
        with self.lock:
            # a request the engine core finished ahead of the reader is gone: vLLM ignores its abort
            super().abort_request([rid for rid in request_ids if rid in self.requests])

    def collective_rpc(self, method, timeout=None, args: tuple = (), kwargs: dict | None = None) -> list:
        deadline = time.monotonic() + 10
        while self.requests and self.outputs.qsize() < self.lead and time.monotonic() < deadline:
            time.sleep(0.0005)   # the engine core runs ahead as far as it may before the call reaches it
        with self.lock:
            return super().collective_rpc(method, timeout, args, kwargs)

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=10)

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.close()


def make_params(**fields):
    """SamplingParams as the fake reads them: the fields VllmEngine gives (sampling_fields)."""
    return SimpleNamespace(**fields)
