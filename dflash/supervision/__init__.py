"""The run's supervision: the supervisor (supervisor.py, run by `python -m dflash.supervise`),
its policy and record of attempts and restarts (record.py) with the run's goodput
(goodput.py), what a restart line says that the trainer could not (restart_facts.py), the
files it writes whatever the disk does (files.py), and status.json, which the trainer writes
and the supervisor reads (status.py), with the states of both and what each means (states.py).
Standard library only, but status.py."""
