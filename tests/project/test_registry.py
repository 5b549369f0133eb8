"""Plugin discovery: duplicates, broken plugins, unknown names, dotted paths, class_path.

Most tests replace ``registry._entry_points`` with fake entry points (real
``importlib.metadata.EntryPoint`` objects bound to a stand-in distribution), so they do not
depend on what is installed; the last ones read the real installed metadata.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from lit_rag import registry
from lit_rag.plugins.rewards.arena import ArenaReward
from lit_rag.plugins.rewards.qa import ExactMatchReward, F1Reward
from lit_rag.registry import PluginError


class FakeDist:
    """The two things ``registry.available`` reads from a distribution."""

    def __init__(self, name: str, version: str = "1.0") -> None:
        self.metadata = {"Name": name}
        self.version = version


def ep(name: str, target: str, package: str, group: str = "lit_rag.rewards") -> metadata.EntryPoint:
    return metadata.EntryPoint(name, target, group)._for(FakeDist(package))


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.clear_cache()
    yield
    registry.clear_cache()


@pytest.fixture
def fake_eps(monkeypatch):
    """Install fake entry points: ``fake_eps(group -> [EntryPoint, ...])``."""

    def install(by_group: dict[str, list[metadata.EntryPoint]]) -> None:
        monkeypatch.setattr(registry, "_entry_points", lambda group: list(by_group.get(group, [])))
        registry.clear_cache()

    return install


ARENA = "lit_rag.plugins.rewards.arena:ArenaReward"
F1 = "lit_rag.plugins.rewards.qa:F1Reward"
EM = "lit_rag.plugins.rewards.qa:ExactMatchReward"


# ---- duplicates --------------------------------------------------------------------------
def test_duplicate_name_from_two_packages_names_both(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), ep("arena", F1, "rag-extras")]})
    with pytest.raises(PluginError) as info:
        registry.available("reward")
    message = str(info.value)
    assert "reward plugin 'arena' is registered twice" in message
    assert "package 'lit-rag'" in message and "package 'rag-extras'" in message
    assert ARENA in message and F1 in message


def test_duplicate_also_fails_load_and_resolve(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("f1", F1, "lit-rag"), ep("f1", F1, "other-pkg")]})
    with pytest.raises(PluginError, match="'lit-rag'.*'other-pkg'"):
        registry.resolve("reward", "f1")


def test_same_entry_point_twice_from_same_package_is_not_an_error(fake_eps) -> None:
    # e.g. one package visible twice on sys.path (an editable install plus a site install)
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), ep("arena", ARENA, "lit-rag")]})
    plugins = registry.available("reward")
    assert list(plugins) == ["arena"]
    assert plugins["arena"].package == "lit-rag"
    assert registry.load("reward", "arena") is ArenaReward


def test_available_records_package_version_target_and_sorts(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("f1", F1, "lit-rag"), ep("arena", ARENA, "lit-rag")]})
    plugins = registry.available("reward")
    assert list(plugins) == ["arena", "f1"]
    assert plugins["f1"] == registry.PluginInfo("reward", "f1", F1, "lit-rag", "1.0")


def test_entry_point_without_distribution_reads_unknown(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [metadata.EntryPoint("f1", F1, "lit_rag.rewards")]})
    assert registry.available("reward")["f1"].package == "<unknown>"


# ---- broken plugins ----------------------------------------------------------------------
def test_plugin_raising_import_error_names_itself(fake_eps, tmp_path: Path, monkeypatch) -> None:
    module = tmp_path / "broken_rag_plugin.py"
    module.write_text("import a_dependency_that_is_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    shiny = ep("shiny", "broken_rag_plugin:Shiny", "rag-shiny")
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), shiny]})
    assert registry.load("reward", "arena") is ArenaReward  # the healthy one still loads
    with pytest.raises(PluginError) as info:
        registry.load("reward", "shiny")
    message = str(info.value)
    assert message.startswith("reward plugin 'shiny' from package 'rag-shiny' failed to load")
    assert "broken_rag_plugin:Shiny" in message
    assert "ModuleNotFoundError" in message and "a_dependency_that_is_not_installed_xyz" in message


def test_plugin_raising_anything_names_itself(fake_eps, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "crashing_rag_plugin.py").write_text("raise RuntimeError('bad config at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake_eps({"lit_rag.rewards": [ep("crash", "crashing_rag_plugin:Reward", "rag-crash")]})
    expected = r"'crash' from package 'rag-crash'.*RuntimeError: bad config"
    with pytest.raises(PluginError, match=expected):
        registry.resolve("reward", "crash")


def test_plugin_with_missing_attribute_names_itself(fake_eps) -> None:
    target = "lit_rag.plugins.rewards.qa:NoSuchReward"
    fake_eps({"lit_rag.rewards": [ep("ghost", target, "rag-ghost")]})
    with pytest.raises(PluginError) as info:
        registry.load("reward", "ghost")
    message = str(info.value)
    assert "reward plugin 'ghost' from package 'rag-ghost' failed to load" in message
    assert target in message and "AttributeError" in message


def test_nested_attribute_target_loads(fake_eps) -> None:
    # "module:Outer.inner" walks attributes; here ArenaReward.score is a plain function
    target = "lit_rag.plugins.rewards.arena:ArenaReward.score"
    fake_eps({"lit_rag.rewards": [ep("nested", target, "x")]})
    assert registry.load("reward", "nested") is ArenaReward.score


# ---- unknown names -----------------------------------------------------------------------
def test_unknown_name_lists_installed_names(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("f1", F1, "lit-rag"), ep("arena", ARENA, "lit-rag")]})
    with pytest.raises(PluginError) as info:
        registry.resolve("reward", "arena2")
    assert str(info.value) == "unknown reward 'arena2'; installed: arena, f1"


def test_unknown_name_with_nothing_installed(fake_eps) -> None:
    fake_eps({})
    with pytest.raises(PluginError) as info:
        registry.load("engine", "vllm")
    assert str(info.value) == "unknown engine 'vllm'; installed: none"


def test_unknown_kind_lists_kinds() -> None:
    with pytest.raises(PluginError) as info:
        registry.available("rewards")
    assert str(info.value) == (
        "unknown plugin kind 'rewards'; "
        "known kinds: algorithm, reward, environment, retriever, engine, tool, advantage, "
        "policy_loss"
    )


# ---- dotted paths and class_path -----------------------------------------------------------
def test_dotted_path_resolves_without_registration(fake_eps) -> None:
    fake_eps({})
    assert registry.resolve("reward", "lit_rag.plugins.rewards.qa.F1Reward") is F1Reward


def test_bad_dotted_paths_fail_with_the_path(fake_eps) -> None:
    fake_eps({})
    expected = r"reward 'lit_rag.plugins.rewards.qa.Nope' could not be imported"
    with pytest.raises(PluginError, match=expected):
        registry.resolve("reward", "lit_rag.plugins.rewards.qa.Nope")
    with pytest.raises(PluginError, match=r"reward 'no_such_pkg_xyz.Reward' could not be imported"):
        registry.resolve("reward", "no_such_pkg_xyz.Reward")


def test_class_path_of_short_name_class_name_and_dotted_path(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), ep("exact_match", EM, "lit-rag")]})
    assert registry.class_path("reward", "arena") == "lit_rag.plugins.rewards.arena.ArenaReward"
    expected = "lit_rag.plugins.rewards.qa.ExactMatchReward"
    assert registry.class_path("reward", "ExactMatchReward") == expected
    dotted = "my_pkg.rewards.Mine"  # returned as written, not imported
    assert registry.class_path("reward", dotted) == dotted


def test_class_path_of_unknown_name_lists_installed(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), ep("exact_match", EM, "lit-rag")]})
    with pytest.raises(PluginError) as info:
        registry.class_path("reward", "arena2")
    assert str(info.value) == "unknown reward 'arena2'; installed: arena, exact_match"


def test_unknown_name_is_reported_even_if_another_plugin_is_broken(fake_eps) -> None:
    ghost = ep("ghost", "no_such_mod_xyz:G", "rag-ghost")
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), ghost]})
    with pytest.raises(PluginError) as info:
        registry.class_path("reward", "arena2")
    assert str(info.value) == "unknown reward 'arena2'; installed: arena, ghost"


def test_clear_cache_sees_newly_installed_plugins(fake_eps) -> None:
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag")]})
    assert list(registry.available("reward")) == ["arena"]
    fake_eps({"lit_rag.rewards": [ep("arena", ARENA, "lit-rag"), ep("f1", F1, "lit-rag")]})
    assert list(registry.available("reward")) == ["arena", "f1"]


# ---- the real installed metadata ---------------------------------------------------------
BUILTINS = {
    ("algorithm", "grpo"),
    ("reward", "arena"),
    ("reward", "exact_match"),
    ("reward", "f1"),
    ("reward", "composite"),
    ("environment", "single_turn"),
    ("engine", "hf"),
}


def test_all_plugins_lists_every_builtin_from_lit_rag() -> None:
    plugins = registry.all_plugins()
    by_key = {(p.kind, p.name): p for p in plugins}
    assert BUILTINS <= set(by_key)
    for key in BUILTINS:
        assert by_key[key].package == "lit-rag", key
        assert by_key[key].version == metadata.version("lit-rag")
    kinds = [p.kind for p in plugins]
    # grouped by kind, in GROUPS order
    assert kinds == sorted(kinds, key=list(registry.GROUPS).index)


def test_every_builtin_loads_and_round_trips_through_class_path() -> None:
    for kind, name in sorted(BUILTINS):
        cls = registry.resolve(kind, name)
        assert registry.resolve(kind, registry.class_path(kind, name)) is cls
        assert registry.class_path(kind, cls.__name__) == registry.class_path(kind, name)
    assert registry.resolve("reward", "exact_match") is ExactMatchReward
