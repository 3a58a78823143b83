"""The render cache behind plan(): a plan of an unchanged serving renders nothing, scaling renders only the new
groups, any other spec change or a new serving of the same name renders afresh, and the bound holds."""

from __future__ import annotations

import pytest
from flashserve.api.validation import parse_serving
from flashserve.controller.observe import Observed
from flashserve.controller.plan import plan
from flashserve.render import cache as cache_mod
from flashserve.render.cache import RenderCache
from flashserve.render.renderer import render_serving

from tests.builders import observe


def serving(replicas: int, name: str = "flash", uid: str = "u1", image: str | None = None):
    spec: dict = {"replicas": replicas}
    if image:
        spec["engine"] = {"image": image}
    return parse_serving({"apiVersion": "flashserve.io/v1alpha1", "kind": "DeepSeekServing",
                          "metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": spec})  # fmt: skip


@pytest.fixture
def renders(monkeypatch) -> list[tuple]:
    """Every call of the renderers behind the cache: (what, serving, group index)."""
    seen: list[tuple] = []
    group, shared = cache_mod.render_group, cache_mod.render_shared

    def counted_group(obj, index):
        seen.append(("group", obj.metadata["name"], index))
        return group(obj, index)

    def counted_shared(obj, operator_namespace, api_server):
        seen.append(("shared", obj.metadata["name"], None))
        return shared(obj, operator_namespace, api_server)

    monkeypatch.setattr(cache_mod, "render_group", counted_group)
    monkeypatch.setattr(cache_mod, "render_shared", counted_shared)
    return seen


def test_second_plan_of_an_unchanged_serving_renders_nothing(renders):
    cache = RenderCache()
    obj = serving(3)
    first = plan(obj, Observed(), cache=cache)
    assert sorted(renders, key=str) == sorted([("group", "flash", i) for i in range(3)] + [("shared", "flash", None)],
                                              key=str)  # fmt: skip
    # What the cache hands out is what rendering gives (the client Service aside: it points at the engines
    # until a router pod is available, which none is here).
    client = lambda o: (o["kind"], o["metadata"]["name"]) == ("Service", "flash")  # noqa: E731
    rendered = render_serving(obj)
    assert [o for o in first.apply if not client(o)] == [o for o in rendered if not client(o)]
    (planned,), (made,) = [o for o in first.apply if client(o)], [o for o in rendered if client(o)]
    assert {**planned, "spec": {**planned["spec"], "selector": made["spec"]["selector"]}} == made
    renders.clear()
    again = plan(obj, Observed(), cache=cache)
    steady = plan(obj, observe(obj), cache=cache)
    assert renders == []
    assert again.apply == first.apply
    assert steady.writes == 0


def test_scaling_renders_only_the_new_groups_and_another_spec_change_renders_all(renders):
    cache = RenderCache()
    plan(serving(3), Observed(), cache=cache)
    renders.clear()
    plan(serving(5), Observed(), cache=cache)
    assert renders == [("group", "flash", 3), ("group", "flash", 4)]
    renders.clear()
    edited = serving(5, image="vllm/vllm-openai:v0.33.1")
    p = plan(edited, Observed(), cache=cache)
    assert len([r for r in renders if r[0] == "group"]) == 5
    images = {o["spec"]["template"]["spec"]["containers"][0]["image"] for o in p.apply if o["kind"] == "StatefulSet"}
    assert images == {"vllm/vllm-openai:v0.33.1"}


def test_a_new_serving_of_the_same_name_gets_its_own_owner_reference(renders):
    cache = RenderCache()
    plan(serving(1, uid="old"), Observed(), cache=cache)
    p = plan(serving(1, uid="new"), Observed(), cache=cache)
    assert {ref["uid"] for o in p.apply for ref in o["metadata"]["ownerReferences"]} == {"new"}


def test_a_plan_may_modify_what_it_gets_without_touching_the_cache():
    cache = RenderCache()
    obj = serving(1)
    first = plan(obj, Observed(), cache=cache)
    first.apply[0]["metadata"]["labels"]["edited"] = "yes"
    assert "edited" not in plan(obj, Observed(), cache=cache).apply[0]["metadata"]["labels"]


def test_the_bound_evicts_least_recently_used_servings_but_never_the_one_being_planned(renders):
    cache = RenderCache(max_groups=5)
    plan(serving(3, name="a"), Observed(), cache=cache)  # 3 groups + shared = 4 entries
    plan(serving(3, name="b"), Observed(), cache=cache)  # a is evicted to make room
    assert len(cache) <= 5
    renders.clear()
    plan(serving(3, name="b"), Observed(), cache=cache)
    assert renders == []
    plan(serving(3, name="a"), Observed(), cache=cache)
    assert len([r for r in renders if r[1] == "a"]) == 4
    renders.clear()
    big = serving(8, name="c")  # larger than the bound on its own: kept whole while it is planned
    plan(big, Observed(), cache=cache)
    renders.clear()
    plan(big, Observed(), cache=cache)
    assert renders == []


def test_forgetting_a_serving_drops_what_was_rendered_for_it(renders):
    cache = RenderCache()
    obj = serving(2)
    plan(obj, Observed(), cache=cache)
    cache.forget("ns", "flash")
    assert len(cache) == 0
    renders.clear()
    plan(obj, Observed(), cache=cache)
    assert len(renders) == 3
