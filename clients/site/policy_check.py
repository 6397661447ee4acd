"""Checking one request against the site policy: pure functions, no data touched.

The site's round (:mod:`clients.site.site_round`) builds a :class:`Request` from
the run's settings and the instruction and calls :func:`check_request` before it
loads any study: :func:`check_train`, :func:`check_evaluate` or
:func:`check_query` by the message's kind; each raises
:class:`~clients.site.policy.PolicyRefusal` naming the first rule the request
breaks. Every kind checks the task and the sizes the run asks the site to decode
(image size, volume depth, slab slices, bytes of one decoded study), so that no
message makes the site allocate what its hospital did not allow.

Every computation on the training data passes the same training rules
(:func:`check_training`: batch size, steps, DP), whichever message carries it: a
train message (:func:`check_train` adds the codec, the time budget and, for the
cross-site exchange's fine-tune after the last round, ``share-finetuned-model``), an
evaluate message's personalisation adaptation (:func:`check_adaptation`, only where
``evaluate-trains`` allows it). A train message passes the secure-aggregation rules
too (:func:`check_secure_aggregation`): a plain one is refused where the site requires
secure aggregation, each SecAgg+ stage is checked against the round's plan. A loss
query is refused at a site that requires DP (it would release an un-noised function of
the training data).
:func:`releases_val_metrics` decides whether an evaluate reply may carry validation
metrics or only counts (not a refusal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clients.site.policy import PolicyRefusal, SitePolicy
from clients.training.dp_accountants import DEFAULT_ACCOUNTANT

__all__ = ["Request", "check_request", "check_training", "check_train", "check_adaptation",
           "check_evaluate", "check_query", "check_secure_aggregation", "releases_val_metrics"]


@dataclass(frozen=True)
class Request:
    """What a server asks a site to compute, in the terms the policy speaks.

    ``time_budget`` 0 means "no budget" (train until ``local_steps``) and
    counts as infinite; ``dp_noise_multiplier`` 0 means no DP-SGD;
    ``loss_subset`` 0 means the whole training set. ``volume_depth`` and
    ``slab_slices`` are 0 for a task that decodes no volume or slab;
    ``study_bytes`` is the bytes of one decoded float32 study at the run's sizes.
    ``shares_finetuned`` marks the cross-site exchange's fine-tune (a train
    message after the run's last round). ``pruning_report`` is the codec of the per-weight
    squared gradients a PruneFL re-pruning round asks back ("" = none). A SecAgg+ stage (``secagg_stage``: ``setup``,
    ``share-keys``, ``collect`` or ``unmask``; "" = a plain train) carries the round
    plan's participants n, neighbours k and threshold t, and the unmask stage the
    number of inputs the server says it sums (``secagg_summed``; 0 = not announced).
    """

    task: str
    image_size: int
    batch_size: int = 1
    codec: str = "none"
    local_steps: int = 1
    time_budget: float = 0.0
    loss_subset: int = 0
    dp_noise_multiplier: float = 0.0
    dp_max_grad_norm: float = math.inf
    dp_delta: float = 1.0
    dp_accountant: str = DEFAULT_ACCOUNTANT
    volume_depth: int = 0
    slab_slices: int = 0
    study_bytes: int = 0
    shares_finetuned: bool = False
    secagg_stage: str = ""
    secagg_participants: int = 0
    secagg_neighbours: int = 0
    secagg_threshold: int = 0
    secagg_summed: int = 0
    control_variates: str = ""
    pruning_report: str = ""


def _refuse_if(broken: bool, rule: str, detail: str) -> None:
    if broken:
        raise PolicyRefusal(rule, detail)


def _check_common(policy: SitePolicy, request: Request) -> None:
    _refuse_if(not policy.allows_task(request.task), "allowed-tasks",
               f"task {request.task!r} is not in {list(policy.allowed_tasks)}")
    _refuse_if(request.image_size < policy.min_image_size, "min-image-size",
               f"image size {request.image_size} < {policy.min_image_size}")
    _refuse_if(request.image_size > policy.max_image_size, "max-image-size",
               f"image size {request.image_size} > {policy.max_image_size}")
    _refuse_if(request.volume_depth > policy.max_volume_depth, "max-volume-depth",
               f"volume depth {request.volume_depth} > {policy.max_volume_depth}")
    _refuse_if(request.slab_slices > policy.max_slab_slices, "max-slab-slices",
               f"slab slices {request.slab_slices} > {policy.max_slab_slices}")
    _refuse_if(request.study_bytes > policy.max_study_bytes, "max-study-bytes",
               f"one decoded study would take {request.study_bytes} bytes "
               f"({request.study_bytes / 2**30:.1f} GiB) > {policy.max_study_bytes}")


def _check_dp(policy: SitePolicy, request: Request) -> None:
    rules = policy.dp
    uses_dp = request.dp_noise_multiplier > 0
    _refuse_if(rules.required and not uses_dp, "dp.required",
               "the site trains only with DP-SGD (privacy.noise-multiplier > 0)")
    if not uses_dp:
        return
    _refuse_if(request.dp_noise_multiplier < rules.min_noise_multiplier,
               "dp.min-noise-multiplier",
               f"noise multiplier {request.dp_noise_multiplier} < {rules.min_noise_multiplier}")
    _refuse_if(request.dp_max_grad_norm > rules.max_grad_norm, "dp.max-grad-norm",
               f"clipping norm {request.dp_max_grad_norm} > {rules.max_grad_norm}")
    _refuse_if(request.dp_delta > rules.delta, "dp.delta",
               f"delta {request.dp_delta} > {rules.delta}")
    _refuse_if(not rules.allows_accountant(request.dp_accountant), "dp.accountants",
               f"accountant {request.dp_accountant!r} is not in {list(rules.accountants)}")


def check_training(policy: SitePolicy, request: Request) -> None:
    """Refuse a computation on the training data that breaks a training rule of ``policy``.

    The rules every computation that trains passes, whichever message carries it:
    task and sizes, batch size, local steps (above ``max-local-steps`` is refused,
    not clamped), then the DP rules. The epsilon budget (``dp.max-epsilon``) is
    checked by the site's ledger, which knows what was spent.

    Raises
    ------
    PolicyRefusal
        Naming the first broken rule.
    """
    _check_common(policy, request)
    _refuse_if(request.batch_size < policy.min_batch_size, "min-batch-size",
               f"batch size {request.batch_size} < {policy.min_batch_size}")
    _refuse_if(request.local_steps < policy.min_local_steps, "min-local-steps",
               f"local steps {request.local_steps} < {policy.min_local_steps}")
    _refuse_if(request.local_steps > policy.max_local_steps, "max-local-steps",
               f"local steps {request.local_steps} > {policy.max_local_steps}")
    _check_dp(policy, request)


def check_secure_aggregation(policy: SitePolicy, request: Request) -> None:
    """Refuse a train request that breaks a secure-aggregation rule (``[secure-aggregation]``).

    A plain train (no SecAgg+ stage) is refused where the site requires secure
    aggregation. A stage is refused when its plan sums fewer participants than
    ``min-participants`` (or the unmask announces fewer inputs), or when its threshold t
    of the k + 1 holders of a site's shares (its k neighbours and itself) is not a
    strict majority (t > (k + 1)/2, Bell et al. 2020, Sec. 3) or below
    ``min-threshold`` (t / (k + 1)).

    Raises
    ------
    PolicyRefusal
        Naming the broken ``secure-aggregation.*`` rule.
    """
    rules = policy.secure_aggregation
    if not request.secagg_stage:
        _refuse_if(rules.required, "secure-aggregation.required",
                   "the site sends its update only to a securely aggregated round (SecAgg+)")
        return
    _refuse_if(request.secagg_participants < rules.min_participants,
               "secure-aggregation.min-participants",
               f"{request.secagg_participants} participants < {rules.min_participants}")
    _refuse_if(0 < request.secagg_summed < rules.min_participants,
               "secure-aggregation.min-participants",
               f"{request.secagg_summed} inputs summed < {rules.min_participants}")
    t, holders = request.secagg_threshold, request.secagg_neighbours + 1
    _refuse_if(2 * t <= holders or t / holders < rules.min_threshold,
               "secure-aggregation.min-threshold",
               f"threshold {t} of {holders} share holders: not above half and at least "
               f"{rules.min_threshold} of them")


def check_train(policy: SitePolicy, request: Request) -> None:
    """Refuse a train request that breaks a rule of ``policy``.

    Raises
    ------
    PolicyRefusal
        Naming the first broken rule: the cross-site fine-tune where the site keeps
        its fine-tuned model (``share-finetuned-model``), the codec, the time
        budget, SCAFFOLD's control variates (``share-control-variates``), PruneFL's
        squared-gradient report (``share-pruning-gradients``), the secure-aggregation rules, then :func:`check_training`'s rules.
    """
    _refuse_if(request.shares_finetuned and not policy.share_finetuned_model,
               "share-finetuned-model", "the site's fine-tuned model does not leave it "
               "(the cross-site exchange after the last round)")
    codec = request.codec.split(":", 1)[0]
    _refuse_if(not policy.allows_codec(codec), "allowed-codecs",
               f"codec {codec!r} is not in {list(policy.allowed_codecs)}")
    budget = request.time_budget if request.time_budget > 0 else math.inf
    _refuse_if(budget > policy.max_time_budget, "max-time-budget",
               f"time budget {budget} s > {policy.max_time_budget} s")
    _refuse_if(bool(request.control_variates) and not policy.share_control_variates,
               "share-control-variates", f"{request.control_variates}'s control variate "
               "(Delta c_i) does not leave the site with its update")
    _refuse_if(bool(request.pruning_report) and not policy.share_pruning_gradients,
               "share-pruning-gradients", "PruneFL's per-weight squared gradients of the "
               "site's training data do not leave the site")
    check_secure_aggregation(policy, request)
    check_training(policy, request)


def check_adaptation(policy: SitePolicy, request: Request) -> None:
    """Refuse an evaluate message's personalisation adaptation (``request.local_steps`` steps).

    Raises
    ------
    PolicyRefusal
        ``evaluate-trains`` where the site lets no evaluate message train, else
        :func:`check_training`'s rules.
    """
    _refuse_if(not policy.evaluate_trains, "evaluate-trains",
               "an evaluate message does not train at this site (personalisation adaptation)")
    check_training(policy, request)


def check_evaluate(policy: SitePolicy, request: Request) -> None:
    """Refuse an evaluate request for a task or image size the policy does not allow."""
    _check_common(policy, request)


def check_query(policy: SitePolicy, request: Request) -> None:
    """Refuse a loss query the policy does not answer.

    A loss on a subset smaller than ``min-batch-size`` is refused like a
    training batch of that size: it would tell the server about a handful of
    patients. A site that requires DP answers none: a loss is an un-noised
    function of its training data. (How many a federation may ask,
    ``max-queries``, is counted by :mod:`clients.site.query_budget`.)
    """
    _refuse_if(not policy.answer_queries, "answer-queries",
               "the site does not answer loss queries")
    _refuse_if(policy.dp.required, "dp.required",
               "the site requires DP and a loss query's answer is not noised")
    _check_common(policy, request)
    _refuse_if(0 < request.loss_subset < policy.min_batch_size, "min-batch-size",
               f"loss subset {request.loss_subset} < {policy.min_batch_size}")


def check_request(policy: SitePolicy, kind: str, request: Request) -> None:
    """Refuse a ``kind`` request (``train``, ``evaluate`` or ``query``) that breaks a rule.

    Raises
    ------
    PolicyRefusal
        Naming the first broken rule.
    KeyError
        For another kind (:class:`~clients.site.instruction.Instruction` admits none).
    """
    {"train": check_train, "evaluate": check_evaluate, "query": check_query}[kind](policy, request)


def releases_val_metrics(policy: SitePolicy, val_items: int) -> bool:
    """Whether evaluation metrics may leave a site with ``val_items`` items in the evaluated split.

    The rule covers both evaluation splits (``val`` and the held-out ``test``):
    below ``min-val-items`` an evaluate reply carries only counts.
    """
    return val_items >= policy.min_val_items
