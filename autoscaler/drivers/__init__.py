"""Cloud drivers behind one interface (:mod:`autoscaler.drivers.base`).

Nothing here imports a cloud SDK: each driver module imports its SDK when a driver is
built, and says which ``pip install`` is missing when it is not there.
"""
