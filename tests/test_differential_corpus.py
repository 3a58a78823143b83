"""The admission differential's corpus (tests/differential_corpus.py), offline: seeded, it covers every rule
class of api/validation.py, and the operator gives each generated object the verdict it was made for. The API
server's side runs in e2e/test_admission_differential.py."""

from __future__ import annotations

from flashserve.api.validation import SpecError, parse_serving

from tests.differential_corpus import DOCUMENTED, corpus


def _admits(obj: dict) -> bool:
    try:
        parse_serving(obj)
        return True
    except SpecError:
        return False


def test_corpus_is_seeded_and_a_few_hundred_objects():
    a, b = corpus(), corpus()
    assert a == b and len(a) >= 300
    assert corpus(seed=1) != a


def test_each_object_gets_the_verdict_it_was_made_for():
    wrong = [(c.klass, c.obj["spec"]) for c in corpus() if c.expect_admit is not None and _admits(c.obj) != c.expect_admit]
    assert wrong == []


def test_corpus_covers_the_rule_classes():
    broken = {c.klass for c in corpus() if c.expect_admit is False} - {"field:metadata.name"}
    assert len(broken - DOCUMENTED) >= 13
    mutated = [c for c in corpus() if c.klass == "mutated"]
    assert 0 < sum(map(_admits, (c.obj for c in mutated))) < len(mutated)  # the mutations hit both verdicts
