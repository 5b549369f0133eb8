"""EVO-RAG's loop under two DDP processes on CPU (gloo); run by ``test_ddp_evo.py``.

    python tests/scripts/ddp_evo_fit.py OUT_DIR

DPO on sibling pairs (ranks have different numbers of pairs, so different numbers of
micro-batches), the curriculum switch, and a reward-model epoch after each policy epoch on the
pairs of both ranks. Each rank writes ``OUT_DIR/rank<r>.json`` (pair count, cycles, heads).
"""

import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the kit

import lightning as L  # noqa: E402
from kit import EVO_CORPUS, TINY, Steering, evo_rag_reward  # noqa: E402

from lit_rag.callbacks import AlternatingRewardModel, CurriculumCallback, RewardWeightScheduler  # noqa: E402
from lit_rag.data.datamodule import QADataModule  # noqa: E402
from lit_rag.plugins.algorithms.dpo import DPO  # noqa: E402
from lit_rag.plugins.environments.query_rewriter import QueryRewriterEnvironment  # noqa: E402
from lit_rag.plugins.retrievers.bm25 import BM25Retriever  # noqa: E402
from lit_rag.rollout.base import SamplingParams  # noqa: E402
from lit_rag.trainer.optimizer import OptimizerSettings  # noqa: E402
from lit_rag.trainer.policy import PolicyModule  # noqa: E402
from lit_rag.trainer.reward_model import RewardModelModule  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(exist_ok=True)
r = BM25Retriever(stopwords="en")
r.build(EVO_CORPUS)
r.save(out / "index")
rows = [
    {
        "id": f"q{i}",
        "question": "Where was the founder of Orbel Mills born?",
        "answers": ["Kessa"],
        "gold_ids": ["g1", "g2"],
    }
    for i in range(8)
]
(out / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
L.seed_everything(0)
env = QueryRewriterEnvironment(
    BM25Retriever(index=str(out / "index")), top_k=1, t_max=4, branch_states=2
)
m = PolicyModule(
    policy=TINY,
    environment=env,
    reward=evo_rag_reward(),
    algorithm=DPO(selection="reward_model"),
    engine=Steering(),
    group_size=3,
    sampling=SamplingParams(max_new_tokens=16),
    micro_batch_size=4,
    optimizer=OptimizerSettings(lr=1e-3),
)
alt = AlternatingRewardModel(
    RewardModelModule(encoder=TINY, max_length=128, lr=1e-2), batch_size=8, val_fraction=0.25
)
t = L.Trainer(
    strategy="ddp",
    devices=2,
    accelerator="cpu",
    max_epochs=2,
    callbacks=[RewardWeightScheduler(), CurriculumCallback(switch_after_epochs=1), alt],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    num_sanity_val_steps=0,
    limit_val_batches=0,
)
t.fit(m, datamodule=QADataModule(train=str(out / "train.jsonl"), val=None, batch_size=2))
heads = {k: v.tolist() for k, v in alt.reward_model.heads.state_dict().items()}
(out / f"rank{t.global_rank}.json").write_text(
    json.dumps({"pairs": len(alt.pairs), "cycles": alt.cycles, "heads": heads, "hist": alt.history})
)
