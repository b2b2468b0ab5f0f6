"""The application on top of the library: a checked config built into pieces (`experiment.py`),
the checks that need them built (`validation.py`), the warm start and the controls that continue it
(`warm_start.py`, `rft.py`), the jobs the command line runs (`jobs.py`: train, eval, export), a
run's learning curve (`curves.py`) and the plan checked on a device (`plan_check.py`)."""
