"""Training loops, issue 27 items 3-5: tokenizer masks, a wrapped Hugging Face model, a BatchNorm conv net.

Each case builds a real model on the CPU (random weights, seeded) and one
training batch as the loop passes it. :func:`run_case` collects the step
under fake tensors from that model and batch (``estimators.collect_stats``:
the batch's values are followed, so model code that branches on them takes
the batch's path), plans at the given budgets, applies each plan
(``apply_plan(..., stats=, example_inputs=)``) to a copy of the model and
trains it for real (``estimators.measure_steps``, AdamW as collected, the
same seed as the unplanned run), then compares the model state with the
unplanned run's: parameters and buffers after the steps, and the gradients
of one more forward and backward.

Masks, on a BERT-style encoder (``BertForMaskedLM``) and a Llama decoder,
both from configs, SDPA attention, nothing downloaded:

* ``ones``: an all-ones mask (fixed-length rows, no padding), which Hugging
  Face's mask code drops;
* ``padded``: the last quarter of every row is padding (``padded:0.25``, as
  ``sacplan collect --attention-mask`` makes it);
* ``lengths``: rows of 4 different lengths, tokenized with a word-level
  tokenizer built here (the ``tokenizers`` package) and padded to the longest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import planner
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec, make_optimizer, measure_steps
from estimators.collect import attention_mask_batch

BATCH, SEQ = 4, 128
TINY_BERT = {"model_type": "bert", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
             "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": SEQ}
TINY_DECODER = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": SEQ, "use_cache": False}
MASKS = ("ones", "padded", "lengths")
BUDGETS: tuple[float | str, ...] = ("min", 0.5, 0.75, 0.9)  # "min": the smallest feasible budget

Built = tuple[nn.Module, Any, Callable[[Any], torch.Tensor] | None]


def _hf(doc: dict, head: str) -> nn.Module:
    import transformers

    doc = dict(doc)
    config = transformers.AutoConfig.for_model(doc.pop("model_type"), attn_implementation="sdpa", **doc)
    return getattr(transformers, head)(config).train()


def tokenized_batch(vocab: int, lengths: list[int], seq: int) -> dict[str, torch.Tensor]:
    """Rows of the given word counts, through a word-level tokenizer built here, padded to ``seq``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    words = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, vocab)}}
    tok = Tokenizer(WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=seq)
    tok.enable_truncation(seq)
    gen = torch.Generator().manual_seed(1)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(2, vocab, (n,), generator=gen)) for n in lengths]
    enc = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def mask_batch(kind: str, vocab: int) -> dict[str, torch.Tensor]:
    """The batch of one mask kind (see the module doc)."""
    if kind == "lengths":
        return tokenized_batch(vocab, [SEQ, SEQ * 3 // 4, SEQ // 2, SEQ // 3], SEQ)
    ids = torch.randint(2, vocab, (BATCH, SEQ))
    return attention_mask_batch(ids, "padded" if kind == "padded" else "ones", 0.25, 0)


def bert(mask: str) -> Built:
    """A BERT-style encoder, masked-LM loss over the unpadded tokens."""
    torch.manual_seed(0)
    return _hf(TINY_BERT, "BertForMaskedLM"), mask_batch(mask, TINY_BERT["vocab_size"]), None


def decoder(mask: str) -> Built:
    """A Llama decoder, causal-LM loss over the unpadded tokens."""
    torch.manual_seed(0)
    return _hf(TINY_DECODER, "LlamaForCausalLM"), mask_batch(mask, TINY_DECODER["vocab_size"]), None


class Classifier(nn.Module):
    """A user's module around a Hugging Face decoder: its own head and loss on the last real token."""

    def __init__(self, lm: nn.Module, classes: int = 4):
        super().__init__()
        self.backbone = lm
        self.head = nn.Sequential(nn.Linear(lm.config.hidden_size, 64), nn.GELU(), nn.Linear(64, classes))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(-1) - 1  # the last real token of each row
        return nn.functional.cross_entropy(self.head(hidden[torch.arange(hidden.shape[0]), last]), labels)


def wrapped() -> Built:
    """A Hugging Face decoder inside a user module (the root is no transformers class), all-ones mask."""
    torch.manual_seed(0)
    doc = {**TINY_DECODER}
    doc.pop("use_cache")  # as the user builds it: Hugging Face's default (use_cache on)
    batch = mask_batch("ones", TINY_DECODER["vocab_size"])
    batch["labels"] = torch.arange(BATCH) % 4
    model = Classifier(_hf(doc, "LlamaForCausalLM")).train()
    return model, batch, lambda loss: loss


class BasicBlock(nn.Module):
    """ResNet's basic block: conv, BatchNorm, ReLU, conv, BatchNorm, the residual, ReLU."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class ConvNet(nn.Module):
    """A small ResNet: a stem, ``blocks`` basic blocks, global pooling, a linear head."""

    def __init__(self, channels: int = 16, blocks: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU())
        self.blocks = nn.Sequential(*[BasicBlock(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def _class_loss(out: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, torch.arange(out.shape[0]) % out.shape[1])


def batchnorm_net() -> Built:
    """The small ResNet on 8 images of 32 x 32: BatchNorm's running statistics change every step."""
    torch.manual_seed(0)
    return ConvNet().train(), (torch.randn(8, 3, 32, 32),), _class_loss


CASES: dict[str, Callable[[], Built]] = {
    **{f"bert_{m}": (lambda m=m: bert(m)) for m in MASKS},
    **{f"decoder_{m}": (lambda m=m: decoder(m)) for m in MASKS},
    "wrapped_decoder": wrapped,
    "batchnorm_convnet": batchnorm_net,
}


@dataclass
class Row:
    """One case at one budget: the plan's figures, the real peaks, whether the model state matched."""

    case: str
    budget: str  # "min", or the fraction of the baseline
    status: str
    budget_bytes: int
    predicted_bytes: int | None = None
    peaks: tuple[int, ...] = ()
    modules: int = 0
    state_equal: bool | None = None  # parameters, gradients and buffers torch.equal to the unplanned run's
    differing: tuple[str, ...] = ()

    @property
    def steady_ratio(self) -> float | None:
        """The steady state's real / predicted peak farthest from 1 (steps 2 on: AdamW's state is live)."""
        if not self.predicted_bytes or len(self.peaks) < 2:
            return None
        return max((p / self.predicted_bytes for p in self.peaks[1:]), key=lambda r: abs(r - 1))

    @property
    def holds(self) -> bool:
        """Real peak within the budget at every step, steady state within 1%, state bit-identical."""
        ratio = self.steady_ratio
        return (ratio is not None and max(self.peaks) <= self.budget_bytes and abs(ratio - 1) <= 0.01
                and bool(self.state_equal))


def collect(model: nn.Module, inputs: Any, loss_fn: Any) -> planner.Stats:
    """The case's stats, from the real model and batch (on the CPU, roofline costs, AdamW for-loop)."""
    return collect_stats(model, inputs, loss_fn=loss_fn, optimizer="adamw", device="cpu",
                         cost_model=RooflineCostModel(device_spec("cpu")))


def train(model: nn.Module, inputs: Any, loss_fn: Any, steps: int) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Real AdamW steps (seeded); the peaks and the state after them (gradients: of one more forward/backward)."""
    opt = make_optimizer("adamw", list(model.parameters()))
    peaks = [s.peak_bytes for s in measure_steps(model, inputs, loss_fn, opt, steps=steps, seed=0)]
    torch.manual_seed(steps)
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    (loss_fn or (lambda o: o.loss))(out).backward()
    state = {f"param {n}": p.detach().clone() for n, p in model.named_parameters()}
    state.update({f"grad {n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    state.update({f"buffer {n}": b.clone() for n, b in model.named_buffers()})
    return peaks, state


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[str, ...]:
    """The names whose tensors are not ``torch.equal`` (or present in one state only)."""
    return tuple(sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not torch.equal(a[k], b[k])))


def plan_at(stats: planner.Stats, budget: float | str) -> planner.Plan:
    """The plan at a fraction of the baseline peak, or at the smallest feasible budget (``"min"``)."""
    if budget == "min":
        return planner.plan(stats, planner.min_feasible_budget_gib(stats))
    return planner.plan(stats, float(budget) * planner.baseline_peak_bytes(stats) / planner.GIB)


def run_case(name: str, budgets: tuple[float | str, ...] = BUDGETS, steps: int = 3) -> list[Row]:
    """Collect, plan at each budget, train planned and unplanned for ``steps`` steps, compare (see the module doc)."""
    model, inputs, loss_fn = CASES[name]()
    stats = collect(model, inputs, loss_fn)
    base_peaks, base_state = train(copy.deepcopy(model), inputs, loss_fn, steps)
    baseline = planner.baseline_peak_bytes(stats)
    rows = [Row(name, "none", "baseline", baseline, baseline, tuple(base_peaks), 0, True)]
    for budget in budgets:
        plan = plan_at(stats, budget)
        label = budget if isinstance(budget, str) else f"{budget:.0%}"
        row = Row(name, label, plan.status, int(plan.memory_budget_gib * planner.GIB))
        if plan.status in ("optimal", "feasible"):
            planned = copy.deepcopy(model)
            apply_plan(planned, plan, stats=stats, example_inputs=inputs, loss_fn=loss_fn)
            peaks, state = train(planned, inputs, loss_fn, steps)
            diff = differing(base_state, state)
            row.predicted_bytes, row.peaks, row.modules = plan.peak_bytes, tuple(peaks), len(plan.modules)
            row.state_equal, row.differing = not diff, diff
        rows.append(row)
    return rows
