"""Tables from finished sweeps: each experiment file's report renders through these shared helpers and verdicts."""
