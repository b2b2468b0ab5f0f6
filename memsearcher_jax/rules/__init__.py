"""What a run is checked against before any work: the config's rules in one pass (`config_rules.py`),
what it asks of this machine (`machine_rules.py`), and its output directory: what a run may write
there and what `--fresh` may remove (`run_dir.py`). Never imports what builds and runs from a
checked config (`app/`, `cli.py`)."""
