"""Test helpers: the tiny HF config and the real-run measurements the fidelity tests use."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# The "tiny HF Llama": built from this dict, random weights, nothing downloaded.
TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "attention_dropout": 0.1,
}
# The same at 4 experts, top-2: Hugging Face's default experts (grouped_mm) unless a test sets another. No
# dropout: a saved CPU dropout (bernoulli_, then mutated) does not replay exactly yet (issue 17, point 2).
TINY_MIXTRAL = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                "attention_dropout": 0.0}
# the fidelity set's gemma2_eager (../shared/reference/fidelity/gemma2_eager.json) made smaller
TINY_GEMMA2_EAGER = {"model_type": "gemma2", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                     "max_position_embeddings": 512, "sliding_window": 4096, "attn_implementation": "eager"}


def _storages(tree: Any) -> dict[int, torch.UntypedStorage]:
    flat, _ = tree_flatten(tree)
    out = {}
    for t in flat:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            st = t.untyped_storage()
            out[st.data_ptr() or id(st)] = st
    return out


def saved_bytes_by_hooks(model: torch.nn.Module, call: Any) -> tuple[int, Any]:
    """Bytes of the unique storages autograd saves while ``call()`` runs the model's forward.

    Parameters, the inputs' and the output's storages are left out: the stats'
    IA counts activations saved inside the module, not its input or output.
    """
    saved: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.update(_storages(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call()
    exclude = set(_storages(list(model.parameters()) + list(model.buffers()))) | set(_storages(out))
    return sum(st.nbytes() for k, st in saved.items() if k not in exclude), out


class _Watch(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, tuple[weakref.ref, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key, st in _storages(out).items():
            if key not in self.refs or self.refs[key][0]() is None:
                self.refs[key] = (weakref.ref(st), st.nbytes())
        return out


def live_activation_bytes(model: torch.nn.Module, call: Any) -> tuple[int, Any]:
    """Bytes of storages created during ``call()`` that are still alive after it, minus its output.

    Under selective checkpointing these are exactly the tensors kept for
    backward: autograd-saved tensors outside checkpointed regions plus the
    op outputs the policy caches.
    """
    watch = _Watch()
    with watch:
        out = call()
    exclude = set(_storages(list(model.parameters()) + list(model.buffers()))) | set(_storages(out))
    total = sum(n for key, (ref, n) in watch.refs.items() if ref() is not None and key not in exclude)
    return total, out


class StepMemory(TorchDispatchMode):
    """Unique live storages of a real run, by data pointer and weak reference, and the peak per phase.

    Storages made before the run (parameters, buffers, inputs) are given with
    :meth:`register`; every op output is registered when it appears, and a
    weak reference takes it off when it is freed. Peaks are sampled after
    each new storage, where they occur (freeing only lowers the total).
    """

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, weakref.ref] = {}
        self.live_bytes = 0
        self.phase: tuple = ("before",)  # set by the caller: the peaks are kept per phase
        self.peak_bytes: dict[tuple, int] = {}

    def register(self, tree: Any) -> None:
        for st in _storages(tree).values():
            self._add(st)

    def _add(self, st: torch.UntypedStorage) -> None:
        ptr, n = st.data_ptr(), st.nbytes()
        if not ptr or ptr in self.refs:
            return

        def freed(ref: weakref.ref, ptr: int = ptr, n: int = n) -> None:
            if self.refs.get(ptr) is ref:
                del self.refs[ptr]
                self.live_bytes -= n

        self.refs[ptr] = weakref.ref(st, freed)
        self.live_bytes += n
        self.peak_bytes[self.phase] = max(self.peak_bytes.get(self.phase, 0), self.live_bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.register(out)
        return out
