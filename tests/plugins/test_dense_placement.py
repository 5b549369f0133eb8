"""Where the dense index is searched from (``index_device``): the decision as a pure function,
and the retriever applying it to a real faiss CPU index through a recording stand-in for
faiss's GPU calls (faiss-cpu has none; the one real-GPU check is in scripts/gpu_smoke.sh).

Sizes are GiB (2**30 bytes). Every GPU placement adds faiss's 2 GiB per process and GPU
(``GPU_OVERHEAD_BYTES``); ``auto`` takes a GPU within 20% of its free memory, an asked placement
must fit in 90% of it.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import require_package

require_package("faiss", "pip install faiss-cpu")

from lit_rag.errors import InputError
from lit_rag.plugins.retrievers import dense
from lit_rag.plugins.retrievers.dense import DenseRetriever
from lit_rag.plugins.retrievers.index_placement import (
    INDEX_DEVICE_KEY,
    FaissGpu,
    IndexPlacement,
    node_ranks,
    place_index,
)
from lit_rag.types import Passage

GiB = 2**30


def one_line_error(call) -> str:
    """The message of the :class:`InputError` ``call()`` raises: one line naming the key."""
    with pytest.raises(InputError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{INDEX_DEVICE_KEY}: got ")
    return message


# -- the decision, a pure function ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "index", "free", "rank", "ranks", "where", "devices"),
    [
        # wiki-18 e5 flat (65 GiB), 8 ranks on 8 GPUs of 80 free: one copy per GPU needs
        # 65 + 2 = 67 > 0.2 * 80 = 16: host
        ("auto", 65, [80] * 8, 5, 8, "host", ()),
        # asked for, it fits beside nothing: 67 <= 0.9 * 80 = 72, on rank 5's own GPU
        ("gpu", 65, [80] * 8, 5, 8, "gpu", (5,)),
        # one process on one H200 (141 free): 67 > 0.2 * 141 = 28.2: host; asked, 67 <= 126.9
        ("auto", 65, [141], 0, 1, "host", ()),
        ("gpu", 65, [141], 0, 1, "gpu", (0,)),
        # 1M e5-base passages (1M * 768 * 4 bytes = 2.9 GiB, say 3): 3 + 2 = 5 <= 16: rank 3's GPU
        ("auto", 3, [80] * 8, 3, 8, "gpu", (3,)),
        # 4 ranks on 2 GPUs: ranks 1 and 3 share GPU 1, 2 * (3 + 2) = 10 > 0.2 * 40 = 8: host;
        # asked, 10 <= 36
        ("auto", 3, [40, 40], 3, 4, "host", ()),
        ("gpu", 3, [40, 40], 3, 4, "gpu", (1,)),
        # one process (a server, index search) on 8 GPUs: a whole copy 67 > 16, but a slice
        # 65 / 8 + 2 = 10.1 <= 16 on each: shard
        ("auto", 65, [80] * 8, 0, 1, "shard", tuple(range(8))),
        # host asked: host, whatever the GPUs
        ("host", 1, [80] * 8, 0, 8, "host", ()),
        # no GPU faiss can use (faiss-cpu, or none visible): host
        ("auto", 1, [], 0, 1, "host", ()),
    ],
)
def test_placement(requested, index, free, rank, ranks, where, devices):
    frees = [f * GiB for f in free]
    placement = place_index(requested, "flat", index * GiB, frees, rank, ranks)
    assert (placement.where, placement.devices) == (where, devices), placement.reason
    assert placement.reason and "\n" not in placement.reason


def test_the_old_placement_of_every_rank_on_gpu_0_is_refused():
    # What faiss-gpu did before: 8 ranks each copying the 65 GiB index to GPU 0. As a plan, 8
    # ranks on the one GPU they all see: 8 * (65 + 2) = 536 GiB against 0.9 * 80 = 72.
    message = one_line_error(lambda: place_index("gpu", "flat", 65 * GiB, [80 * GiB], 0, 8))
    assert "8 copies on GPU 0" in message and "536.0 GiB" in message and "80.0 GiB" in message
    assert "allowed: host" in message and "lit-rag index serve" in message


def test_shard_from_every_rank_saves_nothing():
    # 8 ranks each sharding the 65 GiB index over 8 GPUs: 8 * (65 / 8 + 2) = 81 GiB on each
    # GPU, more than 0.9 * 80 = 72: refused (one process sharding needs 10.1 GiB, above).
    message = one_line_error(lambda: place_index("shard", "flat", 65 * GiB, [80 * GiB] * 8, 0, 8))
    assert "81.0 GiB" in message


def test_hnsw_never_goes_to_a_gpu():
    for asked in ("gpu", "shard"):
        message = one_line_error(lambda a=asked: place_index(a, "hnsw", GiB, [80 * GiB], 0, 1))
        assert "no GPU HNSW" in message and "allowed for hnsw: auto, host" in message
    assert place_index("auto", "hnsw", GiB, [80 * GiB], 0, 1).where == "host"
    # known from the settings alone: refused when the retriever is made
    one_line_error(lambda: DenseRetriever(faiss_index="hnsw", index_device="gpu"))


def test_gpus_asked_where_faiss_has_none():
    message = one_line_error(lambda: place_index("gpu", "ivf", GiB, [], 0, 1))
    assert "faiss-gpu" in message and "allowed: auto, host" in message


def test_an_unknown_value_names_the_allowed_ones():
    message = one_line_error(lambda: DenseRetriever(index_device="cuda:1"))  # type: ignore[arg-type]
    assert message.endswith("got 'cuda:1'; allowed: auto, host, gpu, shard")


@pytest.mark.parametrize(
    ("environ", "gpus", "expected"),
    [
        ({}, 8, (0, 1)),  # one process
        ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}, 8, (3, 4)),  # torchrun
        ({"LOCAL_RANK": "3", "WORLD_SIZE": "4"}, 8, (3, 4)),  # Lightning's launcher, one node
        ({"LOCAL_RANK": "3", "WORLD_SIZE": "16"}, 8, (3, 8)),  # two nodes of 8: capped at 8 GPUs
        # a rollout worker of rank 3: its own GPU, as CUDA_VISIBLE_DEVICES gives it
        ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "7"}, 1, (0, 1)),
    ],
)
def test_node_ranks(environ, gpus, expected):
    assert node_ranks(environ, gpus) == expected


# -- the retriever, with a recording stand-in for faiss's GPU calls ------------------------------

PASSAGES = [Passage(f"p{i}", f"T{i}", f"passage number {i}") for i in range(40)]


class TableEncodedRetriever(DenseRetriever):
    """A dense retriever whose encoder is a stand-in: each text's vector is drawn from a
    generator seeded by the text (16 floats, normalized), so a passage's own text finds it.
    Placement does not depend on the encoder; no model is loaded."""

    def encode(self, texts: list[str], prefix: str = "") -> np.ndarray:
        rows = [np.random.default_rng(zlib.crc32((prefix + t).encode())).random(16) for t in texts]
        vectors = np.asarray(rows, dtype=np.float32)  # [N, 16]
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class StandInGpuIndex:
    """Stand-in for a faiss GPU index: searches the CPU index it was made from."""

    def __init__(self, cpu, devices: tuple[int, ...]) -> None:
        self.cpu, self.devices, self.d, self.ntotal = cpu, devices, cpu.d, cpu.ntotal

    def search(self, vectors, k):
        return self.cpu.search(vectors, k)


class StandInFaissGpu:
    """Stand-in for faiss-gpu's GPU functions (this machine has faiss-cpu and no GPU): it
    records every call in ``calls`` and makes :class:`StandInGpuIndex` copies."""

    def __init__(self, gpus: int) -> None:
        self.gpus, self.calls = gpus, []

    def get_num_gpus(self) -> int:
        self.calls.append(("get_num_gpus",))
        return self.gpus

    def StandardGpuResources(self):  # noqa: N802 (faiss's name)
        self.calls.append(("StandardGpuResources",))
        return object()

    def index_cpu_to_gpu(self, resources, device, index):
        self.calls.append(("index_cpu_to_gpu", device))
        return StandInGpuIndex(index, (device,))

    def GpuMultipleClonerOptions(self):  # noqa: N802 (faiss's name)
        return SimpleNamespace(shard=False)

    def index_cpu_to_all_gpus(self, index, co=None, ngpu=-1):
        self.calls.append(("index_cpu_to_all_gpus", ngpu, co.shard))
        return StandInGpuIndex(index, tuple(range(ngpu)))

    def index_gpu_to_cpu(self, index):
        self.calls.append(("index_gpu_to_cpu",))
        return index.cpu


PLACING = {"StandardGpuResources", "index_cpu_to_gpu", "index_cpu_to_all_gpus"}


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n, free_gib)``: the stand-in with ``n`` GPUs of ``free_gib`` free each, in place
    of every dense retriever's GPU calls; a single process unless a test sets the ranks."""
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)

    def make(n: int, free_gib: float) -> StandInFaissGpu:
        stand_in = StandInFaissGpu(n)

        def free(device: int) -> int:
            stand_in.calls.append(("free", device))
            return int(free_gib * GiB)

        monkeypatch.setattr(dense, "GPU", FaissGpu(stand_in, free))
        return stand_in

    return make


@pytest.fixture
def saved(tmp_path) -> str:
    """A flat index of :data:`PASSAGES` saved on the host (a real faiss CPU index, 2,560 bytes:
    40 vectors of 16 floats)."""
    retriever = TableEncodedRetriever(encoder="table", index_device="host")
    retriever.build(PASSAGES)
    retriever.save(tmp_path / "flat")
    return str(tmp_path / "flat")


def test_rank_3_of_4_places_its_copy_on_gpu_3(gpus, saved, monkeypatch):
    """Before, ``_to_gpu`` called ``index_cpu_to_gpu(resources, 0, index)`` whenever faiss-gpu
    imported, in every rank: four ranks, four whole copies on GPU 0 and none on the others.
    Now rank 3 of 4 reads only GPU 3's free memory and puts its copy there."""
    stand_in = gpus(4, free_gib=80)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    retriever = TableEncodedRetriever(index=saved, encoder="table", index_device="gpu")
    hits = retriever.search(["T7\npassage number 7"], 2)  # the first search opens the index
    assert stand_in.calls == [
        ("get_num_gpus",),
        ("free", 3),
        ("StandardGpuResources",),
        ("index_cpu_to_gpu", 3),
    ]
    assert retriever.placement == IndexPlacement("gpu", (3,), retriever.placement.reason)
    assert hits[0][0].passage.id == "p7"  # searched through the (stand-in) GPU copy


def test_auto_with_an_index_too_big_calls_no_gpu_function(gpus, saved):
    # 2,560 bytes + 2 GiB of faiss's own > 0.2 * 1 GiB free: host, the memory-mapped index
    stand_in = gpus(1, free_gib=1)
    retriever = TableEncodedRetriever(index=saved, encoder="table")
    assert retriever.search(["T3\npassage number 3"], 1)[0][0].passage.id == "p3"
    assert retriever.placement is not None and retriever.placement.where == "host"
    assert "over 20% of the 1.0 GiB free" in retriever.placement.reason
    assert not PLACING & {call[0] for call in stand_in.calls}  # read free memory, placed nothing


def test_gpu_with_an_index_too_big_stops_the_environment_setup(gpus, saved):
    from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment

    # 2,560 bytes + 2 GiB > 0.9 * 1 GiB free
    stand_in = gpus(1, free_gib=1)
    retriever = TableEncodedRetriever(index=saved, encoder="table", index_device="gpu")
    environment = SearchAgentEnvironment(retriever=retriever)
    message = one_line_error(environment.setup)  # before training: the policy loads after it
    assert "1 copy on GPU 0" in message and "2.0 GiB needed, 1.0 GiB free" in message
    assert not PLACING & {call[0] for call in stand_in.calls}


def test_hnsw_index_asked_on_a_gpu_is_refused_when_it_opens(gpus, tmp_path):
    stand_in = gpus(1, free_gib=80)
    built = TableEncodedRetriever(encoder="table", faiss_index="hnsw", hnsw_m=8)
    built.build(PASSAGES)  # auto: host, without asking faiss anything
    built.save(tmp_path / "hnsw")
    assert built.placement.where == "host" and stand_in.calls == []
    lazy = TableEncodedRetriever(index=str(tmp_path / "hnsw"), encoder="table", index_device="gpu")
    assert "no GPU HNSW" in one_line_error(lambda: lazy.search(["T1"], 1))  # the manifest's kind


def test_one_process_shards_over_every_gpu_and_saves_the_cpu_form(gpus, tmp_path):
    stand_in = gpus(2, free_gib=80)
    retriever = TableEncodedRetriever(
        encoder="table", faiss_index="ivf", nlist=4, nprobe=4, index_device="shard"
    )
    retriever.build(PASSAGES)
    assert ("index_cpu_to_all_gpus", 2, True) in stand_in.calls
    assert [c for c in stand_in.calls if c[0] == "free"] == [("free", 0), ("free", 1)]
    retriever.save(tmp_path / "ivf")  # the CPU form, through index_gpu_to_cpu
    assert stand_in.calls[-1] == ("index_gpu_to_cpu",)
    again = TableEncodedRetriever(index=str(tmp_path / "ivf"), encoder="table", index_device="host")
    assert again.search(["T9\npassage number 9"], 1)[0][0].passage.id == "p9"


def test_host_asks_faiss_nothing(gpus, saved):
    stand_in = gpus(8, free_gib=80)
    retriever = TableEncodedRetriever(index=saved, encoder="table", index_device="host")
    retriever.search(["T2"], 1)
    assert stand_in.calls == [] and retriever.placement.where == "host"
