"""The product's state-folder migrations, one module per format change (none yet).

Each module registers one :class:`~app.tooling.state_migrations.Migration` in
:data:`~app.tooling.state_migrations.MIGRATIONS` as ``"<kind>:<version>"``, e.g.
``MIGRATIONS.add("site-state:1", SplitLedgers())`` for the first change of the site state
folder; :data:`~app.tooling.state_migrations.MIGRATIONS` imports every module here on its
first lookup. With it come the fixtures of the release before it
(tests/fixtures/releases/README.md) and a line in docs/DEPLOYMENT-REFERENCE.md, "Upgrades".
"""
