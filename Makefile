# Federated medical imaging on Flower: make targets for a fresh machine.
#   make simulate   install if needed, generate synthetic hospitals if missing,
#                   run the federation in Flower's simulation engine (CPU is fine)
#   make simulate TASK=pe-seg|cxr-cls|ct3d-cls|tabular-cls DATA=shared [SET=ctpa|msd-lung]
#                   the same on the real public sets in ../shared/data, converted once
#                   into data/shared-<set>-<scheme>-seed<seed> (SITES/SCHEME/ALPHA/SEED/
#                   MAX_PER_SITE respected; sets: pe-seg -> ctpa (default) | msd-lung,
#                   cxr-cls -> pneumoniamnist, ct3d-cls -> adrenalmnist3d, tabular-cls ->
#                   heart-disease (its own 4 hospitals: SITES=4); the labels
#                   are the sets' own, see each site's SOURCE.txt). DATA=synthetic or
#                   unset: synthetic hospitals. configs/<task>-<set>.toml, if present,
#                   is the preset of a shared set (PRESET= overrides it).
#   make simulate DATA=pacs   the synthetic hospitals loaded into one Orthanc each (Debian's
#                   orthanc + orthanc-dicomweb), synced over DICOMweb into runs/simulate-pacs/,
#                   federated from the synced folders; every Orthanc stopped at the end
#   make test       install if needed, run all tests
#   make console-screenshots   the console's browser tests (Debian's chromium), saving a
#                   screenshot of each page into docs/console/ (the README's pictures)
#   make predict MODEL=<MLflow URI | /abs/model-folder> DATA=/abs/folder OUT=/abs/out   apply a logged model (below)
#   make tracking-flush [RUN_DIR=...]   send MLflow what an outage at a federation's end left on disk
#   make audit-verify STATE=/abs/state POLICY=/abs/policy.toml   check the site's audit log and its anchors (below)
#   make console SITE=<name> STATE=/abs/state POLICY=/abs/policy.toml   the hospital's console (below)
# Overrides: make simulate ROUNDS=2 SITES=2 STEPS=10 RUN_CONFIG="lr=0.02 batch-size=4"
#            make simulate PRESET=configs/pe-seg-quick.toml
#            make simulate RESUME=1     (continue from the last server checkpoint)
#            make simulate POLICY=/abs/policy.toml  (the virtual sites enforce this site
#                   policy; default: permissive, configs/site-policy-permissive.toml)
#            make simulate DATA_DIR=/abs/folder/with/hospital-00..  (a folder of sites,
#                   used as it is: nothing is generated into a DATA_DIR that holds site folders)
#            make simulate RAY_ADDRESS=host:port  (run the virtual sites on an existing Ray
#                   cluster, `ray start --head --port PORT`; its nodes need this venv and the
#                   data at the same paths)
#            make simulate KIND=vertical [METHOD=pvfed|splitnn|splitnn-u] [SET=cohort|heart-disease]
#                   a vertical federation (pvFed on a vertical set; split learning on the
#                   task's sites), docs/VERTICAL.md
#            make simulate ENGINE=local  (the in-process engine, app/engine/: the same apps in
#                   this process, no SuperLink, no Ray; for small runs. Default ENGINE=ray)
# Unset ROUNDS/STEPS/IMAGE_SIZE/TASK fall back to the preset, then to pyproject.toml.

SHELL        := /bin/bash
PYTHON       ?= python3.11
VENV         := $(CURDIR)/.venv
PY           := $(VENV)/bin/python
STAMP        := $(VENV)/.installed
PIP_VERSION  := 26.3
PSI_VERSION  := 2.0.6

SITES        ?= 3
SEED         ?= 0
TASK         ?=
ROUNDS       ?=
STEPS        ?=
IMAGE_SIZE   ?=
PRESET       ?=
RUN_CONFIG   ?=
ENGINE       ?= ray
RESUME       ?=
# Data of `make simulate` / `make data`: synthetic (default) or shared (../shared/data).
# (`make supernode DATA=/abs/site` is a different use of DATA, see the deployment section.)
DATA         ?=
SET          ?=
SCHEME       ?= iid
ALPHA        ?= 0.5
MAX_PER_SITE ?=
SHARED_DATA  ?= $(abspath ../shared/data)
# Synthetic hospitals and real shared sets per task come from the task registry
# (clients/registry.py, asked through `python -m clients.datagen`); the first set of
# a task is its default SET, looked up only when shared data is asked for.
# A DATA_DIR given by the user (command line or environment) that holds site folders is
# used as it is: nothing is generated or converted into it (read before DATA_DIR gets a default).
DATA_DIR_GIVEN := $(filter-out undefined,$(origin DATA_DIR))
TASK_NAME    := $(if $(TASK),$(TASK),pe-seg)
DATAGEN      := $(PY) -m clients.datagen
ifneq ($(filter shared,$(DATA))$(filter shared-data,$(MAKECMDGOALS)),)
# (the registry imports only the standard library: any python3 answers before `make install`)
SET_NAME     := $(if $(SET),$(SET),$(shell $(firstword $(wildcard $(PY)) python3) -m clients.datagen default-set $(TASK_NAME)))
endif
SHARED_TAG   := $(SET_NAME)-$(SCHEME)$(if $(filter dirichlet,$(SCHEME)),$(ALPHA))$(if $(MAX_PER_SITE),-max$(MAX_PER_SITE))-seed$(SEED)
SHARED_OUT   := $(CURDIR)/data/shared-$(SHARED_TAG)
SHARED_CONVERT = $(DATAGEN) shared --task $(TASK_NAME) --set $(SET_NAME) \
		--shared $(SHARED_DATA) --sites $(SITES) --scheme $(SCHEME) --alpha $(ALPHA) --seed $(SEED) \
		$(if $(MAX_PER_SITE),--max-per-site $(MAX_PER_SITE))
# KIND=vertical: a vertical federation (docs/VERTICAL.md). METHOD=pvfed (default) runs on a
# vertical set, SET=cohort (the synthetic multimodal cohort, default) | heart-disease
# (../shared/data's Cleveland patients split by department), written once into
# data/vertical-<set>-seed<seed>; METHOD=splitnn | splitnn-u runs split learning on the
# task's horizontal sites (TASK=cxr-cls, DATA=synthetic or shared as above).
KIND         ?= horizontal
METHOD       ?= pvfed
VERTICAL_SET := $(if $(SET),$(SET),cohort)
ifneq ($(filter-out horizontal vertical,$(KIND)),)
$(error KIND=$(KIND): `make simulate` takes KIND=horizontal (default) or KIND=vertical)
endif
ifeq ($(KIND),vertical)
VERTICAL_RUN := -c federation.kind=vertical -c vertical.method=$(METHOD)
ifeq ($(METHOD),pvfed)
PVFED_DATA   := 1
DATA_DIR     ?= $(CURDIR)/data/vertical-$(VERTICAL_SET)-seed$(SEED)
SITES        := 3
CHECKPOINT_DIR ?= $(CURDIR)/runs/checkpoints/simulate-vertical-$(VERTICAL_SET)-seed$(SEED)
endif
endif
ifeq ($(DATA),shared)
DATA_DIR     ?= $(SHARED_OUT)
RUN_PRESET   := $(if $(PRESET),$(PRESET),$(wildcard configs/$(TASK_NAME)-$(SET_NAME).toml))
SHARED_RUN   := -c experiment=fedmed-$(TASK_NAME)-$(SET_NAME)
CHECKPOINT_DIR ?= $(CURDIR)/runs/checkpoints/simulate-$(TASK_NAME)-shared-$(SHARED_TAG)
else
DATA_DIR     ?= $(CURDIR)/data/synthetic-$(TASK_NAME)-seed$(SEED)
RUN_PRESET   := $(PRESET)
SHARED_RUN   :=
CHECKPOINT_DIR ?= $(CURDIR)/runs/checkpoints/simulate-$(TASK_NAME)-seed$(SEED)
endif
ifeq ($(PVFED_DATA),1)
RUN_PRESET   := $(if $(PRESET),$(PRESET),$(wildcard configs/vertical-$(VERTICAL_SET).toml))
endif
ifneq ($(filter simulate data,$(MAKECMDGOALS)),)
ifneq ($(filter-out synthetic shared pacs,$(DATA)),)
$(error DATA=$(DATA): `make simulate` and `make data` take DATA=synthetic (default), DATA=shared or DATA=pacs; give a folder of sites with DATA_DIR=/abs/folder (DATA=/abs/site is for `make supernode`))
endif
endif
TRACKING_URI ?= $(if $(MLFLOW_TRACKING_URI),$(MLFLOW_TRACKING_URI),sqlite:///$(CURDIR)/mlflow.db)
ARTIFACT_ROOT ?= $(CURDIR)/mlartifacts
MLFLOW_PORT  ?= 5000
# `make mlflow-ui`'s uvicorn workers (MLflow's default 4 died on a loaded 2-core machine)
MLFLOW_WORKERS ?= 1
PYTEST_ARGS  ?=
TEST_WORKERS ?= 2

export FLWR_HOME := $(CURDIR)/.flwr
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export RAY_USAGE_STATS_ENABLED := 0
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false

.PHONY: install simulate test test-ray-cluster data mlflow-ui tracking-flush clean distclean

install: $(STAMP)

# torch==2.13.0 is pinned in pyproject.toml: pip takes the CPU wheel from the
# machine's local wheel folder and never resolves a CUDA build. A current pip and
# no byte-compiling at install (modules compile when first imported, only those
# used) take a fresh install from 5.6 to 1.6 min on 2 cores.
# openmined-psi (the private set intersection of vertical federations) pins
# protobuf==6.30.2, which flwr's grpcio-health-checking (protobuf>=6.33.5) excludes; its
# generated code runs on the newer protobuf (tests/clients/test_psi.py): no deps.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION) \
		2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e ".[test]" \
		2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile --no-deps \
		openmined-psi==$(PSI_VERSION) 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
	@touch $@

# Sites are written only into the product's own folders under data/, or into a DATA_DIR
# that holds no site folder yet (the writers refuse any site folder they did not create).
USER_SITES   := $(if $(DATA_DIR_GIVEN),$(wildcard $(DATA_DIR)/*/))
ifneq ($(USER_SITES),)
data:
	@echo "DATA_DIR=$(DATA_DIR) holds site folders: using them as they are (nothing is generated)"
else
data: $(DATA_DIR)/.sites-$(SITES)
endif

# The stamp names the site count; DATA=shared converts the shared set once per
# set/scheme/alpha/seed/cap (the folder name) and site count (the stamp).
$(DATA_DIR)/.sites-$(SITES): | $(STAMP)
ifeq ($(PVFED_DATA),1)
	$(DATAGEN) vertical --set $(VERTICAL_SET) --shared $(SHARED_DATA) --out $(DATA_DIR) --seed $(SEED)
else ifeq ($(DATA),shared)
	$(SHARED_CONVERT) --out $(DATA_DIR)
	@rm -f $(DATA_DIR)/.sites-*
else
	$(DATAGEN) synthetic --task $(TASK_NAME) --out $(DATA_DIR) --sites $(SITES) --seed $(SEED)
endif
	@touch $@

simulate: install data
	$(PY) -m app.tooling.simulate --data-root $(DATA_DIR) --sites $(SITES) \
		--tracking-uri "$(TRACKING_URI)" --artifact-root $(ARTIFACT_ROOT) \
		$(if $(RUN_PRESET),--preset $(abspath $(RUN_PRESET))) \
		$(if $(TASK),-c task=$(TASK)) $(SHARED_RUN) $(if $(ROUNDS),-c num-server-rounds=$(ROUNDS)) \
		$(if $(STEPS),-c local-steps=$(STEPS)) $(if $(IMAGE_SIZE),-c image-size=$(IMAGE_SIZE)) \
		-c seed=$(SEED) -c min-nodes=$(SITES) -c checkpoint-dir=$(CHECKPOINT_DIR) $(VERTICAL_RUN) \
		$(if $(RESUME),-c resume=true) $(if $(POLICY),-c site-policy=$(abspath $(POLICY))) \
		--engine $(ENGINE) $(if $(filter ray,$(ENGINE)),$(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS))) \
		$(if $(filter pacs,$(DATA)),--data-source pacs) $(foreach kv,$(RUN_CONFIG),-c $(kv))

# pytest's exit code 5 (no test collected) is reported, not treated as a failure.
# pytest-xdist workers take one test file at a time (module fixtures are shared within
# a file); the real-process files form two groups that start first, one worker each
# (tests/conftest.py). They mostly wait on their daemons, so the unit tests run beside
# them. TEST_WORKERS=0 runs everything in this process.
test: install
	@$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 \
		$(PYTEST_ARGS) tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# The console's browser tests in headless Chromium, each page's screenshot into docs/console/.
.PHONY: console-screenshots
console-screenshots: install
	FEDMED_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q -p no:cacheprovider \
		tests/app/test_console_browser.py

# The real Ray-cluster test (a loopback head + one worker node; ~6 min on 2 cores, so
# outside `make test`'s CI budget): `make simulate RAY_ADDRESS=...` on a real cluster.
test-ray-cluster: install
	FEDMED_RAY_CLUSTER_TEST=1 $(PY) -m pytest -q tests/integration/test_ray_cluster.py

# A sqlite store that does not exist is an error naming it (mlflow ui would create it empty).
mlflow-ui: install
	@uri="$(TRACKING_URI)"; case "$$uri" in sqlite:///*) test -f "$${uri#sqlite:///}" || { echo "mlflow-ui: the tracking store $$uri does not exist; name the store the federation used: make mlflow-ui TRACKING_URI=... ARTIFACT_ROOT=... (its summary prints the line)" >&2; exit 2; };; esac
	@echo "MLflow UI on http://127.0.0.1:$(MLFLOW_PORT)/#/experiments?workflowType=machine_learning (its Model training view; store $(TRACKING_URI), artifacts $(ARTIFACT_ROOT))"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow ui --backend-store-uri "$(TRACKING_URI)" \
		--default-artifact-root $(ARTIFACT_ROOT) --host 127.0.0.1 --port $(MLFLOW_PORT) \
		--workers $(MLFLOW_WORKERS)

# After an MLflow outage at the end of a federation: send what its checkpoint folder kept
# (the rounds MLflow lacks, the final and best model, their registration, the run's status).
#   make tracking-flush [RUN_DIR=<the folder the federation's summary names>] [TRACKING_URI=...]
# RUN_DIR defaults to `make simulate`'s CHECKPOINT_DIR (every federation under it);
# TRACKING_URI given on the command line replaces the store the federation used.
tracking-flush: install
	$(PY) -m app.tracking.flush $(abspath $(or $(RUN_DIR),$(CHECKPOINT_DIR))) \
		$(if $(filter command line,$(origin TRACKING_URI)),--tracking-uri "$(TRACKING_URI)")

# Removes generated data, Flower state and logs; keeps the MLflow store and the venv.
clean:
	rm -rf data .flwr runs .pytest_cache
	find . -name __pycache__ -type d -prune -not -path "./.venv/*" -exec rm -rf {} +

# Also removes the MLflow store (all tracked federations) and the virtualenv.
distclean: clean
	rm -rf $(VENV) mlflow.db mlartifacts

# --- After the federation: apply a logged model at a hospital (README, "After the federation") ---
#   make predict MODEL=models:/<experiment>-best/<version> | runs:/<run id>/best-model | /abs/model-folder
#                DATA=/abs/site-or-folder OUT=/abs/out [SPLIT=test] [OVERWRITE=1] [DEVICE=cpu]
#                [TRACKING_URI=<the federation's store>]
# (a model is weights + metadata: its task and settings come with it, the network is built by
# this product's code, a model folder holding a pickle is refused; a model folder copied to the
# hospital needs no store; a URI is looked up in TRACKING_URI, which must exist: it is never
# created; DATA is only read, and OUT may not hold it; an existing non-empty OUT is refused
# unless OVERWRITE=1; PERSONAL=/abs/site-folder or the site's node-config TOML applies that
# site's personalised model, docs/PERSONALISATION.md; STORE_TO=/abs/cohort.toml stores the DICOM
# results in that cohort's PACS, STOW-RS or C-STORE, only if POLICY's [pacs] write-back = true;
# STATE=/abs/state, the site's state folder, is required with it: its audit log records the store)
.PHONY: predict

predict: install
	@test -n "$(MODEL)" -a -n "$(DATA)" -a -n "$(OUT)" || { echo "usage: make predict MODEL=<MLflow model URI or /abs/model-folder> DATA=/abs/folder OUT=/abs/out [TRACKING_URI=...] [SPLIT=test] [OVERWRITE=1] [DEVICE=cpu|cuda] [PERSONAL=/abs/site-folder-or-node-config.toml] [STORE_TO=/abs/cohort.toml STATE=/abs/state [POLICY=/abs/policy.toml]]" >&2; exit 2; }
	$(PY) -m app.predict --model "$(MODEL)" --data $(abspath $(DATA)) --out $(abspath $(OUT)) \
		--tracking-uri "$(TRACKING_URI)" $(if $(SPLIT),--split $(SPLIT)) \
		$(if $(OVERWRITE),--overwrite) $(if $(DEVICE),--device $(DEVICE)) \
		$(if $(PERSONAL),--personal $(abspath $(PERSONAL))) \
		$(if $(STORE_TO),--store-to $(abspath $(STORE_TO)) $(if $(STATE),--state $(abspath $(STATE))) --policy $(if $(POLICY),$(abspath $(POLICY)),$(CURDIR)/configs/site-policy.toml))

# --- Deployment: TLS SuperLink with SuperNode authentication (docs/DEPLOYMENT-REFERENCE.md) ---
#   make certs [HOSTS=localhost,127.0.0.1] [SITES_LIST=hospital-a,hospital-b]
#   make superlink [SUPERLINK_PORT=8000]           (foreground; Ctrl-C stops it)
#   make register SITE=hospital-a [PUBKEY=path/to/supernode.pub]
#   make supernode SITE=hospital-a DATA=/abs/site [STATE=/abs/state] [SUPERNODE_PORT=9094] [PROXY=URL]
#                  [POLICY=/abs/policy.toml]   (the site policy; default configs/site-policy.toml)
#                  [RETAIN_DAYS=30]  (a federation's state folder is removed after RETAIN_DAYS
#                                     days untouched; 0 keeps all)
#                  [CONSOLE=1 [CONSOLE_PORT=8470]]  (also serve the hospital's console on
#                                     127.0.0.1:CONSOLE_PORT in the node process; log in
#                                     with the admin token in STATE/console/admin-token
#                                     (STATE default DEPLOY_DIR/supernodes/SITE/state),
#                                     made at its first start, mode 0600)
#                  [WORKER_UID=uid]  (a node started as root runs the approved app in its
#                                     bubblewrap sandbox as this uid, default 65534; the
#                                     data must be readable by it; docs/DEPLOYMENT-REFERENCE.md)
#   make supernodes                                (which sites are online)
#   make federate ROSTER=/abs/roster.toml [ROUNDS=2] [RUN_CONFIG="local-steps=20 min-nodes=2"]
#                 (the site roster, docs/DEPLOYMENT-REFERENCE.md section 3, is required:
#                  ALLOW_NO_ROSTER=1 runs without one; make simulate needs none)
#                 [SIGN_KEY=/abs/app-signing.key]  (sends the app's signature: -c app-signature=...)
#                 [ALLOW_SAME_NAME=1]  (submit although a federation of the same name is
#                                       running; exits 3 when the run was partial: fewer
#                                       sites than federation.min-contributing-sites)
# Approving an app (docs/DEPLOYMENT-REFERENCE.md, "Approving an app"):
#   make signing-key OUT=/abs/dir                  (coordinator: app-signing.key + .pub)
#   make sign-app KEY=/abs/app-signing.key [EXPIRES=YYYY-MM-DD]
#                                                  (coordinator: the app's sha256 and signature,
#                                                   valid through EXPIRES, default 90 days)
#   make approve-app POLICY=/abs/policy.toml SHA256=<64 hex> | FAB=/abs/app.fab [STATE=/abs/state]
#                                                  (hospital: append to the policy's approved-file)
# Artefacts (keys, SuperLink database, logs) live under DEPLOY_DIR; the flwr CLI
# uses its own FLWR_HOME (DEPLOY_FLWR_HOME) with the TLS connection "fedmed-deploy".
DEPLOY_DIR        ?= $(CURDIR)/deploy
DEPLOY_FLWR_HOME  ?= $(CURDIR)/.flwr-deploy
HOSTS             ?= localhost,127.0.0.1
SITES_LIST        ?= hospital-a,hospital-b
SUPERLINK_HOST    ?= 127.0.0.1
SUPERLINK_PORT    ?= 8000
SUPERLINK_ADDRESS ?= 127.0.0.1:$(SUPERLINK_PORT)
SITE              ?=
DATA              ?=
STATE             ?=
SUPERNODE_PORT    ?=
PUBKEY            ?=
MIN_NODES         ?=
ROSTER            ?=
ALLOW_NO_ROSTER   ?=
ALLOW_SAME_NAME   ?=
SIGN_KEY          ?=
DEPLOY_ARGS       = --deploy-dir $(DEPLOY_DIR) --port $(SUPERLINK_PORT) --superlink $(SUPERLINK_ADDRESS)

.PHONY: certs site-key superlink register supernode supernodes federate signing-key sign-app \
	approve-app

certs: install
	$(PY) -m app.tooling.certs --out $(DEPLOY_DIR)/certs --hosts $(HOSTS) $(if $(SITES_LIST),--sites $(SITES_LIST))

# At a hospital: create only its own SuperNode key pair (send the .pub to the coordinator).
site-key: install
	@test -n "$(SITE)" || { echo "usage: make site-key SITE=<name>" >&2; exit 2; }
	$(PY) -m app.tooling.certs --out $(DEPLOY_DIR)/certs --sites $(SITE)

superlink: install
	$(PY) -m app.tooling.deployment superlink $(DEPLOY_ARGS) --flwr-home $(DEPLOY_FLWR_HOME) \
		--host $(SUPERLINK_HOST)

register: install
	@test -n "$(SITE)" || { echo "usage: make register SITE=<name> [PUBKEY=file.pub]" >&2; exit 2; }
	$(PY) -m app.tooling.deployment register $(DEPLOY_ARGS) --flwr-home $(DEPLOY_FLWR_HOME) \
		--site $(SITE) $(if $(PUBKEY),--public-key $(abspath $(PUBKEY)))

supernode: install
	@test -n "$(SITE)" -a -n "$(DATA)" || { echo "usage: make supernode SITE=<name> DATA=/abs/site/folder [STATE=/abs/dir] [SUPERNODE_PORT=port] [POLICY=/abs/policy.toml] [RETAIN_DAYS=30] [CONSOLE=1 [CONSOLE_PORT=8470]] [WORKER_UID=uid] [PROXY=http://proxy:3128]" >&2; exit 2; }
	$(PY) -m app.tooling.deployment supernode $(DEPLOY_ARGS) --site $(SITE) --data $(abspath $(DATA)) \
		$(if $(STATE),--state $(abspath $(STATE))) \
		$(if $(SUPERNODE_PORT),--runtime-port $(SUPERNODE_PORT)) \
		--policy $(if $(POLICY),$(abspath $(POLICY)),$(CURDIR)/configs/site-policy.toml) \
		$(if $(RETAIN_DAYS),--state-retention-days $(RETAIN_DAYS)) \
		$(if $(filter 1 true yes,$(CONSOLE)),--console-port $(or $(CONSOLE_PORT),8470)) \
		$(if $(WORKER_UID),--worker-uid $(WORKER_UID)) \
		$(if $(PROXY),--proxy $(PROXY))

supernodes: install
	@$(PY) -m app.tooling.deployment nodes $(DEPLOY_ARGS) --flwr-home $(DEPLOY_FLWR_HOME)

federate: install
	$(PY) -m app.tooling.deployment federate $(DEPLOY_ARGS) --flwr-home $(DEPLOY_FLWR_HOME) \
		--tracking-uri "$(TRACKING_URI)" --artifact-root $(ARTIFACT_ROOT) \
		$(if $(PRESET),--preset $(abspath $(PRESET))) \
		$(if $(TASK),-c task=$(TASK)) $(if $(ROUNDS),-c num-server-rounds=$(ROUNDS)) \
		$(if $(STEPS),-c local-steps=$(STEPS)) $(if $(IMAGE_SIZE),-c image-size=$(IMAGE_SIZE)) \
		$(if $(MIN_NODES),-c min-nodes=$(MIN_NODES)) \
		$(if $(ROSTER),-c federation.roster=$(abspath $(ROSTER))) \
		$(if $(filter 1 true yes,$(ALLOW_NO_ROSTER)),--allow-no-roster) \
		$(if $(filter 1 true yes,$(ALLOW_SAME_NAME)),--allow-same-name) \
		$(if $(RESUME),--resume) \
		$(if $(SIGN_KEY),--sign-key $(abspath $(SIGN_KEY))) \
		$(foreach kv,$(RUN_CONFIG),-c $(kv))

signing-key: install
	@test -n "$(OUT)" || { echo "usage: make signing-key OUT=/abs/dir" >&2; exit 2; }
	$(PY) -m app.site_runtime.app_approval keygen --out $(abspath $(OUT))

sign-app: install
	@test -n "$(KEY)" || { echo "usage: make sign-app KEY=/abs/app-signing.key [EXPIRES=YYYY-MM-DD]" >&2; exit 2; }
	$(PY) -m app.site_runtime.app_approval sign --key $(abspath $(KEY)) --app $(CURDIR) \
		$(if $(EXPIRES),--expires $(EXPIRES))

approve-app: install
	@test -n "$(POLICY)" -a -n "$(SHA256)$(FAB)" || { echo "usage: make approve-app POLICY=/abs/policy.toml SHA256=<64 hex> | FAB=/abs/app.fab [STATE=/abs/state (audited)]" >&2; exit 2; }
	$(PY) -m app.site_runtime.app_approval approve --policy $(abspath $(POLICY)) \
		$(if $(STATE),--state $(abspath $(STATE))) \
		$(if $(SHA256),--sha256 $(SHA256),--fab $(abspath $(FAB)))

# --- The SecAgg+ PKI (Bell et al. 2020; app/tooling/secagg_keys.py, docs/DEPLOYMENT-REFERENCE.md) ---
#   make secagg-key SITE=<name> KEY=/abs/secagg.key     (at a hospital: prints its public line)
#   make secagg-roster-add SECAGG_ROSTER=/abs/secagg-roster.json SITE=<name> PUBLIC=<text|file>  (coordinator)
#   make secagg-roster-list SECAGG_ROSTER=/abs/secagg-roster.json     (every hospital: compare the fingerprint)
# Each site names both files in its policy: [secure-aggregation] roster, signing-key.
.PHONY: secagg-key secagg-roster-add secagg-roster-list

secagg-key: install
	@test -n "$(SITE)" -a -n "$(KEY)" || { echo "usage: make secagg-key SITE=<name> KEY=/abs/secagg.key" >&2; exit 2; }
	$(PY) -m app.tooling.secagg_keys keygen --site $(SITE) --out $(abspath $(KEY))

secagg-roster-add: install
	@test -n "$(SECAGG_ROSTER)" -a -n "$(SITE)" -a -n "$(PUBLIC)" || { echo "usage: make secagg-roster-add SECAGG_ROSTER=/abs/secagg-roster.json SITE=<name> PUBLIC=<text|file> [REPLACE=1]" >&2; exit 2; }
	$(PY) -m app.tooling.secagg_keys add --roster $(abspath $(SECAGG_ROSTER)) --site $(SITE) \
		--public $(PUBLIC) $(if $(filter 1 true yes,$(REPLACE)),--replace)

secagg-roster-list: install
	@test -n "$(SECAGG_ROSTER)" || { echo "usage: make secagg-roster-list SECAGG_ROSTER=/abs/secagg-roster.json" >&2; exit 2; }
	$(PY) -m app.tooling.secagg_keys list --roster $(abspath $(SECAGG_ROSTER))

# --- The PSI salt of a vertical federation (one hospital makes it; app/tooling/psi_secret.py) ---
#   make psi-secret PSI_SECRET=/abs/psi.secret
# 32 random bytes, mode 0600, never overwritten; pass the file to the federation's other
# sites over your own channel (never the coordinator) and name it in each site policy:
# [vertical] psi-secret = "/abs/psi.secret" (docs/VERTICAL.md).
.PHONY: psi-secret

psi-secret: install
	@test -n "$(PSI_SECRET)" || { echo "usage: make psi-secret PSI_SECRET=/abs/psi.secret" >&2; exit 2; }
	$(PY) -m app.tooling.psi_secret --out $(abspath $(PSI_SECRET))

# --- The site's privacy budget (hospital admin; app/site_runtime/privacy_budget.py) ---
#   make privacy-budget STATE=/abs/state [DATA=/abs/site] [POLICY=/abs/policy.toml]
#                       [RESET="reason"] [EXTEND=<epsilon> [REASON="text"]]
# Shows the epsilon spent on each dataset by every federation (the one ledger per site and
# dataset), the budget and what is left; RESET archives a dataset's history and starts
# afresh, EXTEND adds to its budget; both leave a line in STATE/privacy/budget-admin.log.
.PHONY: privacy-budget

privacy-budget: install
	@test -n "$(STATE)" || { echo "usage: make privacy-budget STATE=/abs/state [DATA=/abs/site] [POLICY=/abs/policy.toml] [RESET=\"reason\"] [EXTEND=<epsilon> [REASON=\"text\"]]" >&2; exit 2; }
	$(PY) -m app.site_runtime.privacy_budget --state $(abspath $(STATE)) \
		$(if $(DATA),--data $(abspath $(DATA))) $(if $(POLICY),--policy $(abspath $(POLICY))) \
		$(if $(RESET),--reset "$(RESET)") $(if $(EXTEND),--extend $(EXTEND)) \
		$(if $(REASON),--reason "$(REASON)")

# --- The site's audit log (hospital IT / data-protection officer; app/site_runtime/audit_chain.py) ---
#   make audit-verify STATE=/abs/state POLICY=/abs/policy.toml [ARCHIVE=/abs/folder]
#                     [ANCHOR=syslog|/abs/anchor-file|none] [JOURNAL=/abs/exported.txt]
# Checks the hash chain of STATE/audit/ (and of the rotated segments moved to ARCHIVE) and
# every anchor of its head kept off the machine: where POLICY's [audit] anchor sends them
# (ANCHOR= instead: another place, or none for the chain alone). An anchor file is read as
# it is; syslog anchors from `journalctl -t fedmed-audit -o cat`, or from JOURNAL=, that
# output exported on the host that keeps the log (the line says which). Prints
# "audit log OK: N records, head <hash>; intact and matches anchor seq S ..." or
# "...; chain intact but NOT ANCHORED: <why>" (exit 0), or names the first edited, removed,
# reordered or truncated record by file:line and seq, and the first anchor that does not
# match (a chain rewritten whole), exit 1; 2: a missing folder, an unreadable policy or
# anchors. POLICY defaults to configs/site-policy.toml, as for make supernode.
# docs/DEPLOYMENT-REFERENCE.md.
.PHONY: audit-verify

audit-verify: install
	@test -n "$(STATE)" || { echo "usage: make audit-verify STATE=/abs/state POLICY=/abs/policy.toml [ARCHIVE=/abs/folder] [ANCHOR=syslog|/abs/anchor-file|none] [JOURNAL=/abs/exported.txt]" >&2; exit 2; }
	$(PY) -m app.site_runtime.audit_chain --state $(abspath $(STATE)) \
		--policy $(if $(POLICY),$(abspath $(POLICY)),$(CURDIR)/configs/site-policy.toml) \
		$(if $(ANCHOR),--anchor $(if $(filter syslog none,$(ANCHOR)),$(ANCHOR),$(abspath $(ANCHOR)))) \
		$(if $(JOURNAL),--journal $(abspath $(JOURNAL))) \
		$(if $(ARCHIVE),--archive $(abspath $(ARCHIVE)))

# --- The hospital's console (app/site_runtime/console.py; docs/DEPLOYMENT-REFERENCE.md) ---
#   make console SITE=hospital-a STATE=/abs/state POLICY=/abs/policy.toml
#                [CONSOLE_HOST=127.0.0.1] [CONSOLE_PORT=8470]
#                [TLS_CERT=/abs/cert.pem TLS_KEY=/abs/key.pem] [ADMIN_TOKEN_FILE=/abs/token]
#                [ARCHIVE=/abs/folder]  (archived audit segments, as for make audit-verify)
# Serves the console's pages (overview, policy, apps, privacy, activity, data) on loopback
# by default; any other CONSOLE_HOST requires TLS_CERT and TLS_KEY. Every page and action
# needs a login with the admin token, on loopback too: ADMIN_TOKEN_FILE (mode 0600), else
# STATE/console/admin-token, made at the first start (mode 0600) and kept; the console's
# log names the file, never the token.
CONSOLE_HOST     ?=
CONSOLE_PORT     ?=
TLS_CERT         ?=
TLS_KEY          ?=
ADMIN_TOKEN_FILE ?=
.PHONY: console

console: install
	@test -n "$(SITE)" -a -n "$(STATE)" -a -n "$(POLICY)" || { echo "usage: make console SITE=<name> STATE=/abs/state POLICY=/abs/policy.toml [CONSOLE_HOST=127.0.0.1] [CONSOLE_PORT=8470] [TLS_CERT=/abs/cert.pem TLS_KEY=/abs/key.pem] [ADMIN_TOKEN_FILE=/abs/token] [ARCHIVE=/abs/folder] [DATASETS=\"name=/abs/folder ...\"]" >&2; exit 2; }
	$(PY) -m app.site_runtime.console --site $(SITE) --state $(abspath $(STATE)) \
		--policy $(abspath $(POLICY)) $(if $(CONSOLE_HOST),--host $(CONSOLE_HOST)) \
		$(if $(CONSOLE_PORT),--port $(CONSOLE_PORT)) \
		$(if $(TLS_CERT),--tls-cert $(abspath $(TLS_CERT))) \
		$(if $(TLS_KEY),--tls-key $(abspath $(TLS_KEY))) \
		$(if $(ADMIN_TOKEN_FILE),--admin-token-file $(abspath $(ADMIN_TOKEN_FILE))) \
		$(if $(ARCHIVE),--audit-archive $(abspath $(ARCHIVE))) \
		$(foreach ds,$(DATASETS),--data $(ds))

# --- Real shared data as federated sites (../shared/data, see clients/datagen/shared.py) ---
#   make shared-data TASK=cxr-cls|ct3d-cls|pe-seg|tabular-cls [SET=ctpa|msd-lung] [SITES=3]
#                    [SCHEME=iid|dirichlet|size] [ALPHA=0.5] [SEED=0] [MAX_PER_SITE=K]
# (Re)converts into data/shared-<set>-<scheme>-seed<seed> and writes the .sites-$(SITES)
# stamp; `make simulate ... DATA=shared` with the same variables then runs on it (and
# converts by itself when the folder is missing). Labels are the stand-ins' own
# (pneumonia, AdrenalMNIST3D, pulmonary artery, lung tumour), see each site's SOURCE.txt.
.PHONY: shared-data

shared-data: install
	@case "$(TASK_NAME)" in cxr-cls|ct3d-cls|pe-seg|tabular-cls) ;; *) echo "usage: make shared-data TASK=cxr-cls|ct3d-cls|pe-seg|tabular-cls [SET=ctpa|msd-lung] [SITES=3] [SCHEME=iid|dirichlet|size] [ALPHA=0.5] [SEED=0] [MAX_PER_SITE=K]" >&2; exit 2;; esac
	$(SHARED_CONVERT) --out $(SHARED_OUT)
	@rm -f $(SHARED_OUT)/.sites-*
	@touch $(SHARED_OUT)/.sites-$(SITES)
	@echo "run it: make simulate TASK=$(TASK_NAME) DATA=shared$(if $(SET), SET=$(SET)) SITES=$(SITES)$(if $(filter-out iid,$(SCHEME)), SCHEME=$(SCHEME))$(if $(filter dirichlet,$(SCHEME)), ALPHA=$(ALPHA))$(if $(MAX_PER_SITE), MAX_PER_SITE=$(MAX_PER_SITE))$(if $(filter-out 0,$(SEED)), SEED=$(SEED))"
