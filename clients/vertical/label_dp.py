"""Label differential privacy for split learning: the site trains on randomised-response labels.

U-shaped split learning (``splitnn-u``) keeps the labels at the site, but the gradient
it returns still carries them. For a head whose last layer is ``z = W a2 + b`` under the
mean BCE loss over a batch of B, the gradient at the cut of example i is

    dL/da2_i = W^T (sigmoid(z_i) - y_i) / B,

so a coordinator that knows ``W`` (it sent the site part) reads ``y_i`` from the sign
of the projection ``<dL/da2_i, W>`` (least squares on ``W^T`` for several labels):
issue #46 found 16 of 16 labels of a batch this way. Whatever the site returns is
computed from the labels it trains with, so if those labels are epsilon-label-DP, so
is everything derived from them (post-processing; Dwork & Roth 2014, Prop. 2.1).

*Randomised response* (Warner 1965; as label DP for deep learning, Ghazi, Golowich,
Kumar, Manurangsi and Zhang, "Deep learning with label differential privacy", NeurIPS
2021, Alg. 1 ``RR`` without a prior): a label y of k classes is kept with probability

    p(epsilon, k) = e^epsilon / (e^epsilon + k - 1)

and otherwise replaced by one of the other k - 1 classes drawn uniformly, which is
epsilon-label-DP (the ratio of any output's probabilities under two labels is at most
p / ((1 - p) / (k - 1)) = e^epsilon). The product's classification tasks have L
sigmoid labels per item, each 0/1 (:class:`~clients.training.classification.ClassificationTask`):
each label is an RR of k = 2 classes at epsilon / L, so the label vector is
epsilon-label-DP by basic composition (for L = 1, the binary RR at epsilon).

*Drawn once.* RR drawn afresh per round would be averaged away by a coordinator that
runs many rounds (or many federations). So the site draws its noisy labels once per
training item, from ``os.urandom`` (never from a seed the coordinator could know), and
keeps them per dataset, beside the privacy ledger's key
(:func:`~clients.site.privacy_ledger.dataset_id`), in
``<state-dir>/label-dp/<dataset id>/noisy-labels.safetensors`` with the epsilon they
were drawn at: every round and every federation of that dataset trains on the same
noisy labels. A later, smaller epsilon noises the kept labels further (another RR whose
composition with the first is RR at the smaller epsilon, below), so the labels seen
overall stay epsilon-label-DP at the largest epsilon ever used; a larger one keeps the
kept labels (more private than asked). A training set whose size changed refuses: a
fresh draw would give the coordinator a second, independent view of the same patients.

*Composing two RRs.* Two k-ary RRs with keep probabilities p1 then p2 are one k-ary RR
with ``p = p1 p2 + (1 - p1)(1 - p2) / (k - 1)``; so from labels kept at p1 the site
reaches p (1/k <= p <= p1) with ``p2 = (p - q1) / (p1 - q1)``, ``q1 = (1 - p1) / (k - 1)``.

What it does not hide: the activations the site sends depend on its images, not on its
labels (docs/VERTICAL.md); epsilon-label-DP is a bound on what each label can move the
coordinator's view (at epsilon = 1 a binary label is guessed right with probability
e / (e + 1) = 0.73), not zero leakage.
"""

from __future__ import annotations

import fcntl
import math
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

from clients.site.atomic_file import write_atomic
from clients.site.policy import PolicyRefusal, VerticalRules
from clients.site.privacy_ledger import dataset_id
from clients.vertical.split_model import U_SHAPED
from strategies.wire.errors import SiteError

__all__ = ["LABEL_DP_DIR", "NOISY_LABELS", "check_label_rules", "further_keep",
           "keep_probability", "label_keep_probability", "noisy_labels", "randomised_response",
           "renoised", "site_noisy_labels", "urandom_rng"]

#: The site's kept noisy labels, in its state dir: ``label-dp/<dataset id>/``.
LABEL_DP_DIR = "label-dp"
NOISY_LABELS = "noisy-labels.safetensors"


def check_label_rules(rules: VerticalRules, method: str) -> None:
    """The policy's label rules for split training by ``method`` (site and runtime alike).

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.share-labels``: the vanilla SplitNN sends each batch's labels and
        the policy keeps them; rule ``vertical.label-dp-epsilon``: U-shaped training with
        private labels (``share-labels = false``) and no label DP (``inf``), whose
        gradients give the coordinator the labels.
    """
    if method != U_SHAPED and not rules.share_labels:
        raise PolicyRefusal("vertical.share-labels", "the vanilla SplitNN sends each batch's "
                            "labels to the coordinator; this site's policy keeps them (use "
                            "splitnn-u)")
    if method == U_SHAPED and not rules.share_labels and math.isinf(rules.label_dp_epsilon):
        raise PolicyRefusal("vertical.label-dp-epsilon", "U-shaped split learning returns "
                            "per-example gradients from which the coordinator reads the "
                            "labels; this site keeps its labels (share-labels = false) and "
                            "sets no label-DP epsilon (set label-dp-epsilon, e.g. 2)")


def keep_probability(epsilon: float, k: int) -> float:
    """p(epsilon, k) = e^epsilon / (e^epsilon + k - 1): RR keeps the label (Ghazi et al. 2021)."""
    if k < 2:
        raise ValueError(f"randomised response needs k >= 2 classes, got {k}")
    if not epsilon > 0:
        raise ValueError(f"label-DP epsilon must be > 0, got {epsilon}")
    if math.isinf(epsilon):
        return 1.0
    return 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))


def label_keep_probability(epsilon: float, num_labels: int) -> float:
    """The keep probability of each 0/1 label of an L-label vector at vector epsilon (eps / L each)."""
    return keep_probability(epsilon / num_labels, 2)


def randomised_response(labels: np.ndarray, k: int, epsilon: float,
                        rng: np.random.Generator) -> np.ndarray:
    """k-ary RR of integer ``labels`` in [0, k): kept w.p. p(epsilon, k), else a uniform other."""
    labels = np.asarray(labels, np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"labels must lie in [0, {k})")
    keep = rng.random(labels.shape) < keep_probability(epsilon, k)
    other = (labels + rng.integers(1, k, labels.shape)) % k
    return np.where(keep, labels, other)


def noisy_labels(labels: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """``(N, L)`` 0/1 label vectors, each label RR'd at epsilon / L (epsilon-label-DP per vector)."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"label vectors must be (N, L), got shape {labels.shape}")
    binary = (labels > 0.5).astype(np.int64)
    return randomised_response(binary, 2, epsilon / labels.shape[1], rng).astype(np.uint8)


def further_keep(kept: float, target: float, k: int) -> float:
    """p2 with RR(p2) after RR(kept) = RR(target): ``(target - q1) / (kept - q1)``, q1 = (1-kept)/(k-1).

    Raises
    ------
    ValueError
        ``target`` outside [1/k, kept] (RR cannot remove noise, nor go below uniform).
    """
    q1 = (1.0 - kept) / (k - 1)
    if not 1.0 / k <= target <= kept or kept <= q1:
        raise ValueError(f"cannot reach keep probability {target} from {kept} with k = {k}")
    return (target - q1) / (kept - q1)


def renoised(noisy: np.ndarray, kept_epsilon: float, epsilon: float,
             rng: np.random.Generator) -> np.ndarray:
    """Noisy 0/1 ``(N, L)`` labels drawn at ``kept_epsilon``, noised further to ``epsilon`` < it."""
    num_labels = noisy.shape[1]
    p2 = further_keep(label_keep_probability(kept_epsilon, num_labels),
                      label_keep_probability(epsilon, num_labels), 2)
    flip = rng.random(noisy.shape) >= p2
    return np.where(flip, 1 - noisy, noisy).astype(np.uint8)


def urandom_rng() -> np.random.Generator:
    """A generator seeded from ``os.urandom`` (256 bits): nothing the coordinator sends."""
    return np.random.default_rng(int.from_bytes(os.urandom(32), "big"))


def _write(path: Path, labels: np.ndarray, epsilon: float) -> None:
    payload = save_arrays({"labels": np.ascontiguousarray(labels, np.uint8),
                           "epsilon": np.asarray([epsilon], np.float64)})
    write_atomic(path, lambda handle: handle.write(payload))


def site_noisy_labels(state_dir: Path, data_path: Path, labels: np.ndarray, epsilon: float,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """The training labels the site trains with at ``epsilon``: its kept noisy labels.

    Parameters
    ----------
    state_dir : Path
        The site's state dir (the kept labels are in ``label-dp/<dataset id>/``).
    data_path : Path
        The site's data folder: the dataset the labels belong to.
    labels : numpy.ndarray
        ``(N, L)`` 0/1 true labels of the training set, in its order.
    epsilon : float
        The policy's ``vertical.label-dp-epsilon`` (finite, > 0).
    rng : numpy.random.Generator, optional
        Only for tests; the site draws from :func:`urandom_rng`.

    Returns
    -------
    numpy.ndarray
        ``(N, L)`` float32 0/1 noisy labels, the same at every call for this dataset
        (noised further, once, when ``epsilon`` is below the kept labels').

    Raises
    ------
    SiteError
        The kept labels are unreadable or were drawn for a training set of another shape.
    """
    labels = np.asarray(labels)
    if labels.ndim == 1:
        labels = labels[:, None]
    path = Path(state_dir) / LABEL_DP_DIR / dataset_id(data_path) / NOISY_LABELS
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "noisy-labels.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not path.is_file():
                noisy = noisy_labels(labels, epsilon, rng or urandom_rng())
                _write(path, noisy, epsilon)
                return noisy.astype(np.float32)
            try:
                kept = load_arrays(path.read_bytes())
                noisy, kept_epsilon = kept["labels"], float(kept["epsilon"][0])
            except (OSError, KeyError, ValueError, IndexError) as error:
                raise SiteError(f"label DP: the kept noisy labels are unreadable "
                                f"({type(error).__name__}); the site refuses to draw them "
                                "again (a second draw is a second view)") from None
            if noisy.shape != labels.shape:
                raise SiteError(f"label DP: the kept noisy labels are for a training set of "
                                f"shape {noisy.shape}, this one is {labels.shape}; a new draw "
                                f"would give the coordinator a second view (remove {path} "
                                "to accept that)")
            if epsilon < kept_epsilon:
                noisy = renoised(noisy, kept_epsilon, epsilon, rng or urandom_rng())
                _write(path, noisy, epsilon)
            return noisy.astype(np.float32)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
