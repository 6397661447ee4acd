"""Names of the records and metrics exchanged between the ServerApp and the sites.

One place for the message contract, shared by the ClientApp (which builds the
replies) and the strategy (which validates them), so the two cannot drift.

A train instruction carries ``arrays`` (the global model) and ``config``.
A train reply carries ``delta`` (the update x_global - x_local packed by
:mod:`strategies.update_codec`: one encoded ``payload`` plus raw integer
buffers), ``metrics`` and ``site`` (a ConfigRecord with the site's name).
An evaluate reply carries ``metrics`` and ``site``.
"""

ARRAYS = "arrays"
CONFIG = "config"
DELTA = "delta"
METRICS = "metrics"
SITE = "site"

SITE_NAME = "name"
SERVER_ROUND = "server-round"
LOCAL_STEPS = "local-steps"
TIME_BUDGET = "time-budget"
CODEC = "codec"
ERROR_FEEDBACK = "error-feedback"
CODEC_SEED = "codec-seed"
FEDERATION = "federation"
LOSS_SUBSET = "loss-subset"

NUM_EXAMPLES = "num-examples"
STEPS = "steps"
TRAIN_LOSS = "train-loss"
INITIAL_LOSS = "initial-loss"
A_NORM = "a-norm"  # computed by the server (strategies.local_solver); not read from sites
TRAIN_SECONDS = "train-seconds"
STUDIES_SKIPPED = "studies-skipped"
RESIDUAL_NORM = "residual-norm"

VAL_LOSS = "val-loss"

TRAIN_REQUIRED = (NUM_EXAMPLES, STEPS, TRAIN_LOSS, INITIAL_LOSS)
EVALUATE_REQUIRED = (NUM_EXAMPLES,)
QUERY_LOSS = "query-loss"
QUERY_REQUIRED = (NUM_EXAMPLES, QUERY_LOSS)
