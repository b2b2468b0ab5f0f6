"""The memory plan: what one device holds for a training config, before anything is compiled
(`planner.py` lists the rows by phase and adds them up; `memory_estimates.py` sizes each row).
Reads the typed settings; sits below the config's checks, which ask it."""
