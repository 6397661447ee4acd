"""The site's round names no feature, and a feature that is off is not entered (#45).

Found: pruning, SCAFFOLD, the downlink codec, personalisation, the DP charge and SecAgg+
each reached into the site's round loop (``site_training.py``, now the train round of
``site_round.py``, named pruning 29 times, control variates 15, the downlink 10, DP 10;
``instruction.py`` parsed SecAgg+'s and pruning's entries itself). Each is now a
:class:`~clients.site.site_feature.SiteFeature` in its own file, and the loop iterates over
the active ones.

The ban reads every name, string (docstrings included) and comment token of the round
loop and of the round's :class:`~clients.site.instruction.Instruction` (its class: the
run's settings beside it in ``instruction.py`` are a table of run-config keys, each
feature's among them, as the run config has them). The loop is every function and class of
``site_round.py`` (a new one included) but the few that answer for the whole message and
so name a feature by its policy rule or its message kind (:data:`SITE_ROUND_EXEMPT`): the
train round (received, trained, encoded, sealed), the loaded tasks, the sizes asked and the
loss query are read. The scan is case-insensitive, for the features' vocabulary: ``prun``
(pruning, pruned),
``scaffold``, ``control`` (control variates), ``downlink``, ``personali``, ``fedbn``,
``privacy``, ``private``, ``dp`` as a word of its own (``dp_metrics``, ``DP-SGD``; not inside
a word such as ``adapt``), ``epsilon``, ``ledger``, ``secure``, ``secagg``, ``mask``,
``sqgrad``. Tokens rather than the raw text, so that the scan is over what a reader of the
file sees as code and prose, and words, not exact identifiers, so that a renamed
variable (``pruned``, ``masks``) or a docstring that explains a feature's branch still
counts: a feature named in the loop, even in prose, is a feature the loop knows about.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from clients.site.instruction import Instruction
from clients.site.policy import SitePolicy
from clients.site.site_feature import FEATURES, round_features
from clients.site.site_round import answer
from clients.site.site_pruning import SitePruning
from strategies.wire import message_keys as keys
from tests.clients.site_round_fixtures import packed_global, run_settings, site

ROOT = Path(__file__).resolve().parents[3]
#: What ``site_round.py`` holds besides its loop, each naming features by what it answers
#: for: the policy's terms of a message (a field per rule, each feature's among them), the
#: evaluated network (DP's private one, from the run's settings), the evaluate reply
#: (the personalised model's metrics) and the message's dispatch (a SecAgg+ stage).
SITE_ROUND_EXEMPT = ("request_of", "_global_model", "_evaluate", "answer")
#: The loop's code: a file, the one class or function of it read (``None``: all of them),
#: and those of its classes and functions left unread.
LOOP_CODE = (("clients/site/site_round.py", None, SITE_ROUND_EXEMPT),
             ("clients/site/instruction.py", "Instruction", ()))
FEATURE_WORDS = re.compile(
    r"prun|scaffold|control|downlink|personali|fedbn|privacy|private|(?<![a-z])dp(?![a-z])"
    r"|epsilon|ledger|secure|secagg|mask|sqgrad", re.IGNORECASE)
_READ = (tokenize.NAME, tokenize.STRING, tokenize.COMMENT)


def _feature_words(path: Path, within: str | None = None,
                   besides: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(line, token) of every name, string or comment token of ``path`` naming a feature:
    of its top-level class or function ``within`` only, when named; of every top-level class
    and function but those ``besides``, when those are named (each must be one)."""
    text = path.read_text()
    lines = None
    if within is not None or besides:
        defs = {node.name: range(node.lineno, node.end_lineno + 1)
                for node in ast.parse(text).body
                if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
        assert set(besides) <= set(defs), f"{path.name} has no {set(besides) - set(defs)}"
        read = [within] if within is not None else [name for name in defs
                                                     if name not in besides]
        lines = {line for name in read for line in defs[name]}
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(token.start[0], token.string) for token in tokens
            if token.type in _READ and FEATURE_WORDS.search(token.string)
            and (lines is None or token.start[0] in lines)]


@pytest.mark.parametrize("name, within, besides", LOOP_CODE)
def test_the_round_loop_names_no_feature(name, within, besides):
    assert _feature_words(ROOT / name, within, besides) == []


def test_the_train_round_is_read():
    """The train round's functions are the loop the ban reads, none of them left unread."""
    source = (ROOT / "clients/site/site_round.py").read_text()
    defs = {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    train_round = {"received_model", "local_update", "encode_update", "train_round"}
    assert train_round <= defs and not train_round & set(SITE_ROUND_EXEMPT)


def test_the_ban_sees_a_feature_in_code_and_in_prose(tmp_path):
    source = tmp_path / "loop.py"
    source.write_text('"""Trains, then DP-SGD."""\npruned = masks  # the adapted update\n'
                      'class Settings:\n    privacy = 1\n\n\nclass Loop:\n    mask = 2\n')
    assert [line for line, _ in _feature_words(source)] == [1, 2, 2, 4, 8]
    assert [line for line, _ in _feature_words(source, "Loop")] == [8]
    assert [line for line, _ in _feature_words(source, besides=("Settings",))] == [8]
    with pytest.raises(AssertionError, match="no {'Round'}"):
        _feature_words(source, besides=("Round",))


def _train(**config) -> Instruction:
    return Instruction.parse("train", {keys.SERVER_ROUND: 1, **config}, run_settings(), "run-1")


def test_an_off_feature_is_not_built_nor_entered(tmp_path, tasks, monkeypatch):
    def entered(*args, **kwargs):
        raise AssertionError("a feature that is off was built")

    for gate in FEATURES:  # every feature class: building one fails the round
        monkeypatch.setattr(gate.factory.__self__, "__init__", entered)
    plain = _train(**{keys.LOCAL_STEPS: 2})
    assert plain.parts == () and round_features(plain, site(tmp_path), run_settings()) == []
    assert not any(gate.opens(plain, run_settings()) for gate in FEATURES)  # nor entered
    reply = answer(plain, packed_global(), site(tmp_path), run_settings(), tasks)
    assert reply.metrics[keys.STEPS] == 2
    pruned = _train(**{keys.PRUNING_VERSION: 1, keys.PRUNING_MODE: "unstructured"})
    with pytest.raises(AssertionError, match="was built"):  # on, it is built
        round_features(pruned, site(tmp_path), run_settings())


def test_a_part_without_its_feature_is_read_but_not_built(tmp_path):
    asked = _train(**{keys.PRUNING_REPORT: "none"})  # entries, version 0: not pruned
    assert asked.pruning_report == "none" and asked.pruning_version == 0
    assert round_features(asked, site(tmp_path), run_settings()) == []
    pruned = _train(**{keys.PRUNING_VERSION: 2})
    [feature] = round_features(pruned, site(tmp_path, SitePolicy.permissive()), run_settings())
    assert isinstance(feature, SitePruning) and feature.residual_name("r") == "r-mask-2"


@pytest.mark.parametrize("first", ["clients.site.site_pruning",
                                   "clients.training.personalisation.methods.fedbn",
                                   "clients.site.instruction"])
def test_the_seam_its_features_and_the_instruction_load_in_any_order(first):
    """The seam and its table are one module; each feature imports the seam, so the table is
    built on first use: a feature's file imported first still loads, and so does the table."""
    code = (f"import {first}\n"
            "from clients.site.site_feature import FEATURES, INSTRUCTION_PARTS\n"
            "assert len(FEATURES) == 5 and len(INSTRUCTION_PARTS) == 4\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
