"""The coordinator's PSI plan (strategies/vertical/psi_plan.py), run over plain Python sets.

A set stands for a site's items; serving answers with the server's current set,
finishing intersects the site's current set with its request's items the server holds,
as DH-PSI does (tests/clients/test_psi.py runs the real protocol).
"""

from __future__ import annotations

import pytest

from strategies.vertical.psi_plan import REQUEST_STAGE, STEP_STAGE, psi_plan
from strategies.wire.errors import ConfigError


def run_plan(sets: dict[int, set[int]]) -> tuple[dict[int, set[int]], dict[int, list[set[int]]]]:
    """Run the plan over ``sets`` (node -> items): the final sets, what each finish learned."""
    nodes = list(sets)
    current = {node: set(items) for node, items in sets.items()}
    requested: dict[int, set[int]] = {}
    answers: dict[tuple[int, int], set[int]] = {}
    learned: dict[int, list[set[int]]] = {node: [] for node in nodes}
    for step in psi_plan(nodes):
        if step.stage == REQUEST_STAGE:
            requested = {task.node: set(current[task.node]) for task in step.tasks}
            continue
        assert step.stage == STEP_STAGE
        answered: dict[tuple[int, int], set[int]] = {}
        for task in step.tasks:
            if task.finish_with is not None:
                found = requested[task.node] & answers.pop((task.finish_with, task.node))
                learned[task.node].append(found)
                current[task.node] &= found
            for client in task.serve:
                answered[(task.node, client)] = set(current[task.node])
        answers.update(answered)  # a step's answers are read in a later step only
    assert not answers, "every answer is finished with"
    return current, learned


@pytest.mark.parametrize("count", [2, 3, 5])
def test_every_site_ends_with_the_intersection(count: int) -> None:
    sets = {100 + node: set(range(node, 40)) | {1000 + node} for node in range(count)}
    shared = set.intersection(*sets.values())
    final, learned = run_plan(sets)
    assert all(items == shared for items in final.values())
    for position, node in enumerate(sets):
        # forward finishes learn the intersection with the sites before; the last one all of it
        before = set.intersection(*(sets[other] for other in list(sets)[:position + 1]))
        assert learned[node][-1] == shared
        assert all(found in (before, shared) for found in learned[node])


@pytest.mark.parametrize("count", [2, 3, 5])
def test_the_plan_takes_m_plus_three_steps(count: int) -> None:
    nodes = [7 * node + 3 for node in range(count)]
    plan = psi_plan(nodes)
    assert len(plan) == (count - 1) + 3
    assert plan[0].stage == REQUEST_STAGE and [task.node for task in plan[0].tasks] == nodes
    forward = plan[1:count]
    assert [(task.node, task.serve) for step in forward for task in step.tasks] == [
        (nodes[k - 1], (nodes[k],)) for k in range(1, count)]
    finishes = [task.finish_with for step in forward for task in step.tasks]
    assert finishes == [None, *nodes[:count - 2]]
    serve_back, finish_back = plan[count], plan[count + 1]
    assert serve_back.tasks[0].node == nodes[-1] and serve_back.tasks[0].serve == tuple(nodes[:-1])
    assert [task.node for task in finish_back.tasks] == nodes[:-1]
    lasts = [task.node for step in plan for task in step.tasks if task.last]
    assert sorted(lasts) == sorted(nodes), "each site completes exactly once"


@pytest.mark.parametrize("nodes", [[], [4], [4, 4]])
def test_too_few_or_repeated_sites_are_refused(nodes: list[int]) -> None:
    with pytest.raises(ConfigError, match="at least two distinct sites"):
        psi_plan(nodes)
