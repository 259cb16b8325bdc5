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

FakeTPLLM: the same over several GPUs as the sampler sees vLLM's engine then: apply_model goes
through collective_rpc("apply_model", args=(fn,)) to worker processes, so `fn` is pickled (with the
standard pickle, as vLLM's shared-memory broadcast queue does: a closure fails as it would there) and
run once per worker on a copy of the message; the calls are recorded. Its workers share one model
(the tensors' shards are vLLM's business, not the engine's).
"""
from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import torch


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


class FakeTPLLM(FakeLLM):
    def __init__(self, model: torch.nn.Module, tensor_parallel: int = 2, seed: int = 0):
        super().__init__(model, seed)
        self.tensor_parallel = tensor_parallel
        self.rpc_calls: list[tuple] = []   # (method, args) as each call sent them

    def apply_model(self, fn):
        return self.collective_rpc("apply_model", args=(fn,))

    def collective_rpc(self, method, timeout=None, args: tuple = (), kwargs: dict | None = None) -> list:
        self.rpc_calls.append((method, args))
        message = pickle.dumps((method, args, kwargs or {}), protocol=pickle.HIGHEST_PROTOCOL)
        out = []
        for _ in range(self.tensor_parallel):
            name, (fn,), _ = pickle.loads(message)   # (our own bytes: each worker's copy of the one message)
            assert name == "apply_model"
            out.append(fn(self))   # the worker's apply_model(fn): fn(its model)
        return out


def make_params(**fields):
    """SamplingParams as the fake reads them: the fields VllmEngine gives (sampling_fields)."""
    return SimpleNamespace(**fields)
