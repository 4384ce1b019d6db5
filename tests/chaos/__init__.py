"""A chaos soak: a small real deployment under client load while faults arrive at random.

``soak.run(Config(seed=..., seconds=...))`` starts hub(s), two spokes behind emulated WAN
links and mounts, runs writers and readers of every protocol, injects faults from a
schedule drawn from the seed, keeps a ledger of acknowledged writes and checks it at
checkpoints and at the end. ``scripts/chaos_soak.py`` is the long-run command;
``docs/chaos.md`` says what is checked and what each fault is allowed to cause.
"""
