"""Shared-prefix packing: the rows of a micro-batch that share a prompt run it once.

GRPO samples G completions of one prompt, and in RAG the prompt (question plus retrieved
documents) is long while completions are short, so computing each row as prompt + completion
runs the prompt G times. Here a micro-batch's rows are grouped by identical prompt tokens and
each group becomes one packed sequence::

    [ prompt | completion 1 | completion 2 | ... | completion k ]

with per-token position ids (every completion starts at position ``len(prompt)``) and a
boolean attention mask in which a completion token sees the prompt and its own completion's
earlier tokens, never another completion's. Every completion token's log-prob is then exactly
the one the unshared row computes (the masked keys add ``exp(-inf) = 0`` to the softmax), and
since the prompt's hidden states feed every completion of the group, their gradients add up
as the G separate prompt copies' would. This is the "packed sequence with a block mask and
per-sample position ids" of Prefix Grouper (Liu et al., arXiv 2506.05433, Section 3: grouped
attention with the shared prefix encoded once); it needs no change inside the model, only a
custom 4D mask, which transformers passes to the attention as it is.

Without sharing (``share=False``) each row is its own packed sequence, with a padding mask
only: the plain computation, with the right padding of :func:`pack` instead of a left-padded
prompt (no row is padded to the longest prompt of the rollout).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lit_rag.models.attention import Layout


@dataclass
class Packed:
    """A micro-batch laid out as packed sequences.

    Args:
        input_ids: ``[R, L]`` packed sequences, right-padded.
        position_ids: ``[R, L]`` each token's position in its own (unpacked) row.
        padding: ``[R, L]`` 1 at tokens, 0 at padding (the attention mask when no sequence
            packs several rows; see :attr:`attention_mask`).
        sources: ``[T, 2]`` (packed row, position) of the hidden state that predicts each
            completion token.
        targets: ``[T]`` the completion tokens.
        slots: ``[T]`` each token's flat index into the ``[rows, width]`` result.
        rows: Rows of the micro-batch (``N``).
        width: Completion columns of the result.
        real_tokens: Token positions that are not padding.
        layout: Where each packed row's prompt and completions lie, when a sequence packs
            several rows (the attention then runs split, :mod:`lit_rag.models.attention`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    padding: torch.Tensor
    sources: torch.Tensor
    targets: torch.Tensor
    slots: torch.Tensor
    rows: int
    width: int
    real_tokens: int
    layout: Layout | None = None

    def to(self, device: torch.device | str) -> Packed:
        """Every tensor on ``device``."""
        return replace(
            self,
            **{
                name: getattr(self, name).to(device)
                for name in ("input_ids", "position_ids", "padding", "sources", "targets", "slots")
            },
        )

    @property
    def attention_mask(self) -> torch.Tensor:
        """The mask of the masked (not split) computation: :attr:`padding` when no sequence
        packs several rows, else the ``[R, 1, L, L]`` boolean block mask, True where a query
        token (dim 2) may attend to a key token (dim 3). Built on each use (``L^2`` per packed
        row), since the split attention needs none of it."""
        if self.layout is None:
            return self.padding
        return block_mask(self.layout, self.input_ids.shape[1], self.input_ids.device)


def block_mask(layout: Layout, span: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[R, 1, span, span]`` boolean: a prompt token sees the prompt's earlier tokens, a
    completion token the prompt and its own completion's earlier tokens, and a padding token
    itself only (a fully masked row would give NaN)."""
    allowed = (
        torch.eye(span, dtype=torch.bool, device=device)
        .unsqueeze(0)
        .repeat(len(layout.prompts), 1, 1)
    )
    for r, (p, segments) in enumerate(zip(layout.prompts, layout.completions, strict=True)):
        allowed[r, :p, :p] = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        for start, c in segments:
            allowed[r, start : start + c, :p] = True
            allowed[r, start : start + c, start : start + c] = torch.ones(
                c, c, dtype=torch.bool, device=device
            ).tril()
    return allowed.unsqueeze(1)


def split_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int
) -> list[tuple[tuple[int, ...], list[int]]]:
    """``(prompt tokens, completion tokens)`` of each row of a
    :class:`~lit_rag.contracts.algorithm.TrainBatch` layout (prompts left-padded, completions
    right-padded from column ``P = total - width``)."""
    prompt_width = input_ids.shape[1] - width
    ids, mask = input_ids.tolist(), attention_mask.bool().tolist()
    out = []
    for row, keep in zip(ids, mask, strict=True):
        prompt = tuple(t for t, m in zip(row[:prompt_width], keep[:prompt_width], strict=True) if m)
        completion = [t for t, m in zip(row[prompt_width:], keep[prompt_width:], strict=True) if m]
        out.append((prompt, completion))
    return out


def prompt_units(prompts: list[tuple[int, ...]], share: bool = True) -> list[list[int]]:
    """Row indices grouped by identical prompt, in order of first appearance (one row per unit
    when not sharing)."""
    if not share:
        return [[i] for i in range(len(prompts))]
    units: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        units.setdefault(prompt, []).append(i)
    return list(units.values())


def packed_length(prompt: int, completions: list[int]) -> int:
    """Token positions of one packed sequence: the prompt once, then every completion."""
    return prompt + sum(completions)


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    width: int,
    share: bool = True,
    pad_id: int = 0,
) -> Packed:
    """Lay out a micro-batch (prompts left-padded, completions right-padded from column
    ``total - width``) as packed sequences, one per group of rows with the same prompt."""
    rows = split_rows(input_ids, attention_mask, width)
    units = prompt_units([p for p, _ in rows], share)
    lengths = [packed_length(len(rows[u[0]][0]), [len(rows[i][1]) for i in u]) for u in units]
    size, span = len(units), max(lengths)
    ids = torch.full((size, span), pad_id, dtype=torch.long)
    positions = torch.zeros((size, span), dtype=torch.long)
    padding = torch.zeros((size, span), dtype=torch.long)
    shared = any(len(u) > 1 for u in units)
    sources, targets, slots = [], [], []
    segments: list[tuple[tuple[int, int], ...]] = []
    for r, unit in enumerate(units):
        prompt = rows[unit[0]][0]
        p = len(prompt)
        ids[r, :p] = torch.tensor(prompt, dtype=torch.long)
        positions[r, :p] = torch.arange(p)
        padding[r, :p] = 1
        start, spans = p, []
        for i in unit:
            completion = rows[i][1]
            c = len(completion)
            if not c:
                continue
            ids[r, start : start + c] = torch.tensor(completion, dtype=torch.long)
            positions[r, start : start + c] = torch.arange(p, p + c)
            padding[r, start : start + c] = 1
            # token j of the completion is predicted by the state before it: the prompt's last
            # token for j = 0, else the completion's token j - 1
            before = [p - 1] + list(range(start, start + c - 1))
            sources.extend((r, pos) for pos in before)
            targets.extend(completion)
            slots.extend(i * width + j for j in range(c))
            spans.append((start, c))
            start += c
        segments.append(tuple(spans))
    return Packed(
        input_ids=ids,
        position_ids=positions,
        padding=padding,
        sources=torch.tensor(sources, dtype=torch.long).view(-1, 2),
        targets=torch.tensor(targets, dtype=torch.long),
        slots=torch.tensor(slots, dtype=torch.long),
        rows=len(rows),
        width=width,
        real_tokens=sum(lengths),
        layout=Layout(tuple(len(rows[u[0]][0]) for u in units), tuple(segments))
        if shared
        else None,
    )


def model_mask(mask: torch.Tensor, attn_implementation: str | None) -> torch.Tensor:
    """The packed mask in the form the model's attention takes: SDPA and flex take booleans
    (True: attend); eager attention adds the mask to its scores, so it gets 0 / the dtype's
    minimum."""
    if mask.dim() != 4 or attn_implementation in (None, "sdpa", "lit_rag_sdpa", "flex_attention"):
        return mask
    blocked = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return blocked.masked_fill(~mask, torch.finfo(torch.float32).min)


def packed_cost(prompts: list[tuple[int, ...]], completions: list[int], share: bool = True) -> int:
    """Token positions :func:`pack` computes for these rows: packed sequences times the longest."""
    units = prompt_units(prompts, share)
    lengths = [packed_length(len(prompts[u[0]]), [completions[i] for i in u]) for u in units]
    return len(units) * max(lengths) if lengths else 0


def plan_micro_batches(
    prompts: list[tuple[int, ...]],
    completions: list[int],
    max_tokens: int | None,
    max_rows: int | None = None,
    row_group: int = 1,
    share: bool = True,
) -> list[list[int]]:
    """Micro-batches (lists of row indices) of at most ``max_tokens`` packed token positions
    (:func:`packed_cost`, padding included) and at most ``max_rows`` rows.

    Rows that share a prompt go into one micro-batch where the budget allows (a group larger
    than the budget is cut into pieces, each carrying the prompt again); pieces are laid out
    longest first, so a micro-batch pads little. ``row_group`` consecutive rows (DPO: chosen and
    rejected) stay together. A single unit over the budget goes alone.
    """
    n = len(prompts)

    def fits(rows: list[int]) -> bool:
        if max_rows is not None and len(rows) > max_rows:
            return False
        return (
            max_tokens is None
            or packed_cost([prompts[i] for i in rows], [completions[i] for i in rows], share)
            <= max_tokens
        )

    blocks = [list(range(i, min(i + row_group, n))) for i in range(0, n, row_group)]
    units: dict = {}
    for block in blocks:  # blocks with one prompt for all their rows share it with their kind
        same = all(prompts[i] == prompts[block[0]] for i in block)
        units.setdefault(prompts[block[0]] if share and same else ("block", block[0]), []).append(
            block
        )
    pieces: list[list[int]] = []
    for unit_blocks in units.values():
        piece: list[int] = []
        for block in unit_blocks:
            if piece and not fits(piece + block):
                pieces.append(piece)
                piece = []
            piece = piece + block
        pieces.append(piece)

    def length(rows: list[int]) -> int:
        return packed_cost([prompts[i] for i in rows], [completions[i] for i in rows], share)

    pieces.sort(key=length, reverse=True)
    plan: list[list[int]] = []
    for piece in pieces:
        if plan and fits(plan[-1] + piece):
            plan[-1] = plan[-1] + piece
        else:
            plan.append(piece)
    return plan


def balance(micro_batches: list[list[int]], count: int, unit: int = 1) -> list[list[int]]:
    """``micro_batches`` re-split towards ``count`` of them: the one with the most rows halved
    (at a multiple of ``unit`` rows, so a DPO pair stays whole) until there are ``count`` or none
    has more than one unit. A rank with fewer micro-batches than another thus runs smaller real
    passes instead of full ones followed by idle ones (verl re-splits its rows likewise), and
    each pass takes about as long on every rank. Rows keep their order within each piece."""
    out = [list(m) for m in micro_batches]
    while out and len(out) < count:
        i = max(range(len(out)), key=lambda k: len(out[k]))
        rows = out[i]
        if len(rows) <= unit:
            break
        cut = max(unit, (len(rows) // unit // 2) * unit)
        out[i : i + 1] = [rows[:cut], rows[cut:]]
    return out
