"""Names of the records and metrics exchanged between the ServerApp and the sites.

One place for the message contract, shared by the ClientApp (which builds the
replies) and the strategy (which validates them), so the two cannot drift.

A train instruction carries ``arrays`` (the global model) and ``config``.
A train reply carries ``delta`` (the update x_global - x_local packed by
:mod:`strategies.wire.update_codec`: one encoded ``payload`` plus raw integer
buffers), ``metrics`` and ``site`` (a ConfigRecord with the site's name and
its site policy's fingerprint).
An evaluate instruction's ``config`` may carry ``eval-split``: ``val`` (the default:
the split the federation selects on) or ``test`` (the held-out split, never used
for selection). An evaluate reply carries ``metrics`` and ``site``; its metrics
are ``num-examples``, ``<split>-studies`` and, when the site policy's
``min-val-items`` allows, ``<split>-loss`` and ``<split>-<metric>`` per task
metric (``val-loss``, ``val-dice``; ``test-loss``, ``test-dice``). A site without
items in the split replies ``num-examples`` = 0 and ``<split>-studies`` = 0 only.
"""

ARRAYS = "arrays"
CONFIG = "config"
DELTA = "delta"
METRICS = "metrics"
SITE = "site"

SITE_NAME = "name"
SITE_POLICY = "policy"  # the site policy's fingerprint (clients.site.policy), in the SITE record
SERVER_ROUND = "server-round"
LOCAL_STEPS = "local-steps"
TIME_BUDGET = "time-budget"
CODEC = "codec"
ERROR_FEEDBACK = "error-feedback"
CODEC_SEED = "codec-seed"
FEDERATION = "federation"
# Downlink compression (strategies.wire.downlink_header): in a train instruction's config; a
# site's train reply echoes DOWNLINK_VERSION, the reference version it now holds.
DOWNLINK_CODEC = "downlink-codec"
DOWNLINK_VERSION = "downlink-version"
DOWNLINK_BASE = "downlink-base"
DOWNLINK_CHECKSUM = "downlink-checksum"
DOWNLINK_SEED = "downlink-seed"
LOSS_SUBSET = "loss-subset"
EVAL_SPLIT = "eval-split"  # in an evaluate instruction: one of EVAL_SPLITS (default "val")
EVAL_SPLITS = ("val", "test")

NUM_EXAMPLES = "num-examples"
STEPS = "steps"
TRAIN_LOSS = "train-loss"
INITIAL_LOSS = "initial-loss"
A_NORM = "a-norm"  # computed by the server (strategies.wire.local_solver); not read from sites
TRAIN_SECONDS = "train-seconds"
STUDIES_SKIPPED = "studies-skipped"
RESIDUAL_NORM = "residual-norm"
# DP-SGD at the site (clients.site.privacy_ledger): the epsilon spent on the site's data
# after this computation, by every federation and message together (the site's one ledger,
# per site and dataset), this computation's increase of it, and what is left of the site's
# budget (absent: no budget; metrics are finite). Sent by every reply charged to the ledger.
EPSILON = "epsilon"
EPSILON_ROUND = "epsilon-round"
EPSILON_LEFT = "epsilon-left"
# In the SITE record of an evaluate reply: the policy rules (comma-separated) under which the
# site withheld metrics it would otherwise send ("min-val-items", "evaluate-trains"); absent
# when nothing was withheld. The server reports "withheld by site policy (<rule>)", not NaN.
WITHHELD = "withheld"

VAL_LOSS = "val-loss"
VAL_STUDIES = "val-studies"
TEST_LOSS = "test-loss"
TEST_STUDIES = "test-studies"

TRAIN_REQUIRED = (NUM_EXAMPLES, STEPS, TRAIN_LOSS, INITIAL_LOSS)
EVALUATE_REQUIRED = (NUM_EXAMPLES,)
QUERY_LOSS = "query-loss"
QUERY_REQUIRED = (NUM_EXAMPLES, QUERY_LOSS)

# Error replies (app.site_errors): a policy refusal has this code and a reason
# holding POLICY_RULE_PREFIX + the rule's name.
POLICY_REFUSAL_CODE = 4003
POLICY_RULE_PREFIX = "policy rule "
# The site runner (app.site_runtime.site_runner) refuses an app bundle the site did not
# approve with this code, and answers with this one when its warm worker failed.
APP_REFUSAL_CODE = 4005
WORKER_FAILURE_CODE = 4006
# The site runtime's egress filter (app.site_runtime.egress_filter) replaces a reply that breaks
# one of its rules (``egress.*``) with an error reply of this code, whose reason names the rule
# as a policy refusal does (POLICY_RULE_PREFIX + rule + " (refused)").
EGRESS_REFUSAL_CODE = 4007

# Secure aggregation (SecAgg+, strategies.secure_aggregation): every stage is a train message
# whose config names the stage; a stage reply's protocol entries travel in the ConfigRecord
# SECAGG, the collect reply's masked vector as the single array SECAGG_MASKED of DELTA.
# Participants are named by their index 1..n in the round, never by node id.
SECAGG = "secagg"
SECAGG_STAGE = "secagg-stage"
SECAGG_SETUP, SECAGG_SHARE_KEYS, SECAGG_COLLECT, SECAGG_CONSISTENCY, SECAGG_UNMASK = (
    "setup", "share-keys", "collect", "consistency", "unmask")
SECAGG_STAGES = (SECAGG_SETUP, SECAGG_SHARE_KEYS, SECAGG_COLLECT, SECAGG_CONSISTENCY,
                 SECAGG_UNMASK)
# The round plan, in every stage's config (strategies.wire.secure_aggregation.settings.RoundPlan).
SECAGG_INDEX = "secagg-index"
SECAGG_PARTICIPANTS = "secagg-participants"
SECAGG_NEIGHBOURS = "secagg-neighbours"
SECAGG_THRESHOLD = "secagg-threshold"
SECAGG_BITS = "secagg-bits"
SECAGG_CLIP = "secagg-clip"
# share-keys config: the neighbours' indices and their two public keys, in the same order.
SECAGG_PEERS = "secagg-peers"
SECAGG_PEER_KEYS_C = "secagg-peer-keys-c"
SECAGG_PEER_KEYS_S = "secagg-peer-keys-s"
# ... and, in the same order, each neighbour's site name and its signature of its keys
# (strategies.wire.secure_aggregation.signing.key_statement, checked against the roster).
SECAGG_PEER_NAMES = "secagg-peer-names"
SECAGG_PEER_SIGNATURES = "secagg-peer-signatures"
# collect config: the encrypted shares addressed to the site, by their sender's index, and
# the weights the site applies before masking (strategies.wire.secure_aggregation.weights).
SECAGG_SHARES_FROM = "secagg-shares-from"
SECAGG_SHARES = "secagg-shares"
SECAGG_WEIGHT_REFERENCE = "secagg-weight-reference"
SECAGG_A_FLOOR = "secagg-a-floor"
SECAGG_MASKED = "secagg-masked"
# consistency and unmask config: the whole survivor set U3 (the sites whose masked input
# arrived), indices and site names in the same order; unmask config also: the signers'
# indices and their signatures of U3 (Bonawitz et al. 2017, ConsistencyCheck), and how many
# inputs the sum holds (the site's policy min-participants is checked against it).
SECAGG_SURVIVORS = "secagg-survivors"
SECAGG_SURVIVOR_NAMES = "secagg-survivor-names"
SECAGG_SIGNERS = "secagg-signers"
SECAGG_SIGNATURES = "secagg-signatures"
SECAGG_SUMMED = "secagg-summed"
# Reply entries (in the SECAGG record): setup's public keys; share-keys' ciphertexts by
# recipient index and the commitment to the self-mask seed; unmask's shares by owner index.
SECAGG_KEY_C = "key-c"
SECAGG_KEY_S = "key-s"
SECAGG_KEY_SIGNATURE = "key-signature"
SECAGG_SURVIVOR_SIGNATURE = "survivor-signature"
SECAGG_SHARE_TO = "share-to"
SECAGG_CIPHERTEXTS = "ciphertexts"
SECAGG_COMMITMENT = "commitment"
SECAGG_SEED_SHARES_OF = "seed-shares-of"
SECAGG_SEED_SHARES = "seed-shares"
SECAGG_KEY_SHARES_OF = "key-shares-of"
SECAGG_KEY_SHARES = "key-shares"

# A vertical federation (docs/VERTICAL.md): every message is of type VERTICAL_MESSAGE_TYPE;
# its CONFIG names the stage (VERTICAL_STAGE), the federation (FEDERATION) and the round
# (SERVER_ROUND) besides the stage's own entries, its ARRAYS the stage's named arrays. The
# reply carries VERTICAL (named arrays), METRICS and SITE (the stage's short strings).
VERTICAL_MESSAGE_TYPE = "train.vertical"
VERTICAL = "vertical"
VERTICAL_STAGE = "vertical-stage"

# Adaptive pruning (PruneFL, strategies.plugins.pruning; docs/COMPRESSION.md): a train
# instruction's config names the mask version of its model (absent: no pruning), the mode and,
# in a re-pruning round, the codec of the squared gradients the site sends back (PRUNING_SQGRAD,
# an array of DELTA); the model's covered arrays travel compacted (kept values only) and the
# mask itself (strategies.wire.pruning_mask.mask_record) only to a node that has not
# acknowledged its version, which a train reply echoes as the metric PRUNING_VERSION.
PRUNING_VERSION = "pruning-version"
PRUNING_MODE = "pruning-mode"
PRUNING_REPORT = "pruning-report"
PRUNING_SQGRAD = "pruning-sqgrad"

# Control variates (SCAFFOLD, strategies.plugins.control_variates): a train instruction's config
# names the method (CONTROL_VARIATES, absent: none) and the codec of the server's c
# (CONTROL_CODEC, the downlink codec); c travels as the array CONTROL_C of ARRAYS, one payload
# over the model's float arrays; the reply's DELTA carries Delta c_i as the array CONTROL_DELTA,
# encoded with the round's CODEC and CODEC_SEED.
CONTROL_VARIATES = "control-variates"
CONTROL_CODEC = "control-variates-codec"
CONTROL_C = "scaffold-c"
CONTROL_DELTA = "scaffold-dc"
