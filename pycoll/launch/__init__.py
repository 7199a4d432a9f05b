"""Starting a job and finding one's place in it.

* :mod:`pycoll.launch.launcher` -- ``pycoll-run`` (also ``python -m pycoll.run``): starts the ranks of a
  job on a node, hosts its store, watches them.
* :mod:`pycoll.launch.discovery` -- rank discovery from the launcher's environment (pycoll-run,
  torchrun, SLURM, Open MPI) and the job's store.
* :mod:`pycoll.launch.keys` -- the launcher's store keys and the helpers the runtime uses on them
  (:func:`~pycoll.launch.keys.mark_lost`, :func:`~pycoll.launch.keys.failures`).

This package imports none of them, so that importing :mod:`pycoll.launch.keys` does not import the
launcher.
"""
