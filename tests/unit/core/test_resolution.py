"""Model resolution rules, in DESIGN.md's order, with no sockets."""

from __future__ import annotations

import pytest

from proxy.core.resolution import (
    MEMO,
    ModelTable,
    ServedModel,
    basename,
    parse_models_list,
)

QWEN = ServedModel("Qwen2.5-0.5B", "/models/Qwen/Qwen2.5-0.5B")


def table(
    *served: ServedModel, aliases: dict[str, str] | None = None, ci: bool = True
) -> ModelTable:
    return ModelTable(list(served), aliases, case_insensitive=ci)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Qwen/Qwen2.5-0.5B", "Qwen2.5-0.5B"),
        ("/data/ckpt/Qwen2.5-0.5B/", "Qwen2.5-0.5B"),
        ("Qwen2.5-0.5B", "Qwen2.5-0.5B"),
        ("", ""),
    ],
)
def test_basename(name: str, expected: str) -> None:
    assert basename(name) == expected


def test_exact_name_wins_and_is_unchanged() -> None:
    res = table(QWEN).resolve("Qwen2.5-0.5B")
    assert (res.served, res.rule, res.changed) == ("Qwen2.5-0.5B", "exact", False)


def test_configured_alias() -> None:
    res = table(QWEN, aliases={"policy": "Qwen2.5-0.5B"}).resolve("policy")
    assert (res.served, res.rule) == ("Qwen2.5-0.5B", "alias")


def test_alias_beats_root_and_basename() -> None:
    other = ServedModel("other", "/x/other")
    t = table(QWEN, other, aliases={"/models/Qwen/Qwen2.5-0.5B": "other"})
    assert t.resolve("/models/Qwen/Qwen2.5-0.5B").served == "other"


def test_root_path() -> None:
    res = table(QWEN).resolve("/models/Qwen/Qwen2.5-0.5B")
    assert (res.served, res.rule) == ("Qwen2.5-0.5B", "root")


def test_hf_path_to_served_basename() -> None:
    res = table(QWEN).resolve("Qwen/Qwen2.5-0.5B")
    assert (res.served, res.rule, res.changed) == ("Qwen2.5-0.5B", "basename", True)


def test_basename_to_served_hf_path() -> None:
    res = table(ServedModel("Qwen/Qwen2.5-0.5B")).resolve("Qwen2.5-0.5B")
    assert (res.served, res.rule) == ("Qwen/Qwen2.5-0.5B", "basename")


def test_local_path_by_last_component() -> None:
    res = table(ServedModel("tiny", "/models/org/tiny-llama")).resolve("/elsewhere/tiny-llama")
    assert (res.served, res.rule) == ("tiny", "basename")


def test_case_rule_and_switch() -> None:
    assert table(QWEN).resolve("qwen/QWEN2.5-0.5b").rule == "case"
    assert table(QWEN).resolve("qwen/QWEN2.5-0.5b").served == "Qwen2.5-0.5B"
    assert table(QWEN, ci=False).resolve("qwen/QWEN2.5-0.5b").rule == "unresolved"


def test_case_exact_before_case_basename() -> None:
    t = table(ServedModel("a/Model", "/r1"), ServedModel("model", "/r2"))
    assert t.resolve("MODEL").served == "model"


def test_two_models_claiming_one_basename_are_ambiguous() -> None:
    t = table(ServedModel("org-a/tiny", "/a/tiny"), ServedModel("org-b/tiny", "/b/tiny"))
    res = t.resolve("other/tiny")
    assert res.rule == "ambiguous"
    assert res.served is None
    assert set(res.candidates) == {"org-a/tiny", "org-b/tiny"}


def test_two_names_for_one_model_are_not_ambiguous() -> None:
    # vLLM `--served-model-name tiny-model org/tiny-model`: one root, two names; the first answers.
    t = table(
        ServedModel("tiny-model", "/models/tiny"), ServedModel("org/tiny-model", "/models/tiny")
    )
    res = t.resolve("other/tiny-model")
    assert (res.served, res.rule) == ("tiny-model", "basename")


def test_case_ambiguity() -> None:
    t = table(ServedModel("Tiny", "/a"), ServedModel("tiny", "/b"))
    assert t.resolve("Tiny").rule == "exact"
    assert t.resolve("TINY").rule == "ambiguous"


def test_unresolved_and_suggestions() -> None:
    t = table(QWEN, ServedModel("llama-3-8b", "/m/llama-3-8b"))
    res = t.resolve("Qwen/Qwen2.5-1.5B")
    assert (res.served, res.rule) == (None, "unresolved")
    assert t.suggestions("Qwen/Qwen2.5-1.5B")[0] == "Qwen2.5-0.5B"
    assert "llama-3-8b" not in t.suggestions("Qwen/Qwen2.5-1.5B")


def test_empty_table_resolves_nothing() -> None:
    assert table().resolve("anything").rule == "unresolved"


def test_describe_lists_aliases_with_rules() -> None:
    t = table(QWEN, aliases={"policy": "Qwen2.5-0.5B"})
    described = t.describe()
    (entry,) = described["served"]
    assert entry["id"] == "Qwen2.5-0.5B"
    assert entry["root"] == "/models/Qwen/Qwen2.5-0.5B"
    rules = {(a["alias"], a["rule"]) for a in entry["aliases"]}
    assert ("policy", "alias") in rules
    assert ("/models/Qwen/Qwen2.5-0.5B", "root") in rules
    assert ("*/Qwen2.5-0.5B", "basename") in rules
    assert described["ambiguous"] == []


def test_describe_shows_ambiguity() -> None:
    t = table(ServedModel("a/tiny", "/a/tiny"), ServedModel("b/tiny", "/b/tiny"))
    amb = t.describe()["ambiguous"]
    assert {"alias": "*/tiny", "rule": "basename", "candidates": ["a/tiny", "b/tiny"]} in amb


def test_parse_models_list_reads_id_and_root() -> None:
    payload = {"object": "list", "data": [{"id": "m", "root": "/r", "parent": None}, {"id": "n"}]}
    assert parse_models_list(payload) == [ServedModel("m", "/r"), ServedModel("n", None)]


@pytest.mark.parametrize("payload", [[], {"data": {}}, {"data": [{"root": "/r"}]}, None])
def test_parse_models_list_rejects_other_shapes(payload: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies with the shape
        parse_models_list(payload)


def test_basename_keeps_letters_next_to_the_slash() -> None:
    assert basename("org/MODEL-X/") == "MODEL-X"


def test_case_insensitive_is_the_default() -> None:
    t = ModelTable([QWEN])
    assert t.resolve("qwen2.5-0.5b").rule == "case"
    assert t.describe()["case_insensitive"] is True


def test_failed_resolutions_keep_the_requested_name() -> None:
    t = table(ServedModel("a/tiny", "/a/tiny"), ServedModel("b/tiny", "/b/tiny"))
    assert t.resolve("c/tiny").requested == "c/tiny"  # ambiguous
    assert t.resolve("c/huge").requested == "c/huge"  # unresolved


def test_aliases_that_differ_only_in_case() -> None:
    two_models = table(
        ServedModel("m1", "/a"), ServedModel("m2", "/b"), aliases={"Fast": "m1", "FAST": "m2"}
    )
    assert two_models.resolve("fast").rule == "ambiguous"
    one_model = table(
        ServedModel("m1", "/a"), ServedModel("m2", "/a"), aliases={"Fast": "m1", "FAST": "m2"}
    )
    assert one_model.resolve("fast").rule == "case"


def test_suggestions_best_first_at_most_three_from_a_ratio_of_0_4() -> None:
    t = table(*(ServedModel(n) for n in ("abcd", "model-a", "model-ab", "model-abc", "modem")))
    assert t.suggestions("org/model-abc") == ("model-abc", "model-ab", "model-a")
    assert t.suggestions("a") == ("abcd",)  # ratio 2 * 1 / 5 = 0.4


def test_describe_everything() -> None:
    t = table(
        ServedModel("b/tiny", "/b/tiny"),
        ServedModel("a/tiny", "/a/tiny"),
        QWEN,
        aliases={"policy": "Qwen2.5-0.5B", "ghost": "gone"},
    )
    tiny = ["b/tiny", "a/tiny"]
    assert t.describe() == {
        "served": [
            {"id": "b/tiny", "root": "/b/tiny", "aliases": [{"alias": "/b/tiny", "rule": "root"}]},
            {"id": "a/tiny", "root": "/a/tiny", "aliases": [{"alias": "/a/tiny", "rule": "root"}]},
            {
                "id": "Qwen2.5-0.5B",
                "root": "/models/Qwen/Qwen2.5-0.5B",
                "aliases": [
                    {"alias": "policy", "rule": "alias"},
                    {"alias": "/models/Qwen/Qwen2.5-0.5B", "rule": "root"},
                    {"alias": "*/Qwen2.5-0.5B", "rule": "basename"},
                    {"alias": "qwen2.5-0.5b", "rule": "case"},
                    {"alias": "/models/qwen/qwen2.5-0.5b", "rule": "case"},
                    {"alias": "*/qwen2.5-0.5b", "rule": "case"},
                ],
            },
            # An alias to a name the upstream does not serve is listed under that name.
            {"id": "gone", "root": None, "aliases": [{"alias": "ghost", "rule": "alias"}]},
        ],
        "ambiguous": [
            {"alias": "*/tiny", "rule": "basename", "candidates": tiny},
            {"alias": "*/tiny", "rule": "case", "candidates": tiny},
        ],
        "case_insensitive": True,
    }


def test_parse_models_list_ignores_a_root_that_is_not_a_string() -> None:
    assert parse_models_list({"data": [{"id": "m", "root": 7}]}) == [ServedModel("m", None)]


def test_a_name_is_worked_out_once_per_table_and_strangers_displace_nothing() -> None:
    models = table(QWEN, aliases={"policy": "Qwen2.5-0.5B"})
    first = models.resolve("Qwen/Qwen2.5-0.5B")
    assert models.resolve("Qwen/Qwen2.5-0.5B") is first  # remembered, not worked out again
    # A client's stream of made-up names fills the memo to its bound and no further...
    for n in range(MEMO + 500):
        assert models.resolve(f"made-up-{n}").rule == "unresolved"
    assert len(models._memo) == MEMO
    # ...and every answer is still the rules' own, remembered or not.
    for name in ("Qwen/Qwen2.5-0.5B", "policy", "POLICY", "qwen2.5-0.5b", "made-up-1", "x/y"):
        assert models.resolve(name) == models._resolve(name)
    assert models.resolve("policy").served == "Qwen2.5-0.5B"
